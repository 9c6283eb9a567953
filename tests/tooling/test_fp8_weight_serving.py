"""The block-FP8 serving runs the README and docs/BENCHMARKS.md quote (results/serve/v3_fp8_tp8_h200_long and
_long_repeat: two runs of the TP 8 shape on one host, weights with a spread of 1 / sqrt(fan-in), what
SNAPMLA_DUMMY_WEIGHTS=deployment draws, routed scaling 1.0; results/serve/v3_fp8_dp_attention_h200_long: the 128-head
shape under DP attention) give the figures they print: ratios recomputed from the saved JSON and the server-log
excerpts."""

import json
import math
import re
from pathlib import Path

import pytest

from benchmarks.server_log_stats import log_stats
from harness.results import read_json
from harness.server_log import BATCH_LINE, decode_lines, field, read_log, startup_report
from helpers import clock_seconds, doc_sections, quoted_range

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results/serve/v3_fp8_tp8_h200_long"
RUNS = {"first": RUN, "second": ROOT / "results/serve/v3_fp8_tp8_h200_long_repeat"}
# per run: snapmla's output rate / BF16's, its TTFT p50 / BF16's, its output rate / SGLang FP8's, its TTFT p50 /
# SGLang FP8's
QUOTED = {"first": ("1.35x", "0.74x", "1.23x", "0.59x"), "second": ("1.35x", "0.74x", "1.23x", "0.60x")}
SECTION = "Block-FP8 weights: DeepSeek-V3/R1 per GPU at TP 8 (H200)"
LABELS = {"flashmla": "flashmla BF16", "snapmla": "snapmla", "flashmla-fp8": "SGLang FP8 cache"}


def load(run: str) -> dict:
    return {r["run"]: r for r in read_json(RUNS[run] / "serve_bench.json")}


def section_text() -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[SECTION]


def test_one_workload_three_backends_per_run():
    workloads = set()
    for run in RUNS:
        runs = load(run)
        assert set(runs) == {"snapmla", "flashmla", "flashmla-fp8"}
        workloads |= {repr(r["workload"]) for r in runs.values()}
        assert all(r["completed"] == 120 and "error" not in r for r in runs.values())
    assert len(workloads) == 1 and "deepseek-v3-fp8-tp8" in workloads.pop()


def test_only_the_second_runs_sglang_fp8_row_is_rebuilt_and_the_section_says_so():
    recovered = {(run, name) for run in RUNS for name, r in load(run).items() if r.get("recovered")}
    assert recovered == {("second", "flashmla-fp8")}
    assert "row is rebuilt from its bench text and server log" in " ".join(section_text().split())


@pytest.mark.parametrize("run", RUNS)
def test_docs_quote_the_ratios_of_the_saved_runs(run):
    runs = load(run)
    snap, bf16, fp8 = runs["snapmla"], runs["flashmla"], runs["flashmla-fp8"]
    ratios = {"out_bf16": snap["output_tok_s"] / bf16["output_tok_s"],
              "ttft_bf16": snap["median_ttft_ms"] / bf16["median_ttft_ms"],
              "out_fp8": snap["output_tok_s"] / fp8["output_tok_s"],
              "ttft_fp8": snap["median_ttft_ms"] / fp8["median_ttft_ms"]}
    quoted = tuple(f"{r:.2f}x" for r in ratios.values())
    assert quoted == QUOTED[run], ratios
    # every backend's outputs decode to text and its probe's logprobs are finite (the stale-MoE runs' were not), so
    # every TTFT is compared
    for r in runs.values():
        assert r["retokenized_output_tokens"] > 0.9 * r["output_tokens"], r["run"]
        assert all(lp is not None for lp in r.get("endpoints", {}).get("generate_logprobs", [])), r["run"]
    section = " ".join(section_text().split())
    for i in range(len(QUOTED[run])):
        figure = quoted_range([QUOTED[k][i] for k in RUNS])
        assert figure in section, figure
    rows = [ln for ln in section_text().splitlines() if ln.startswith(f"| {run} |")]
    assert len(rows) == 3
    for r in runs.values():  # the table's output rate, TTFT, pool and peak columns
        row = next(ln for ln in rows if ln.startswith(f"| {run} | {LABELS[r['run']]} |"))
        assert f"| {r['output_tok_s']:,.0f}".replace(",", " ") in row, row
        assert f"| {r['median_ttft_ms'] / 1000:.1f}" in row, row
        assert f"| {r['median_tpot_ms']:.1f} |" in row, row
        assert f"{r['pool_tokens']:,}".replace(",", " ") in row and f"| {r['peak_running_req']} |" in row, row


def test_readme_row_gives_the_range_of_both_runs():
    """The README's block-FP8 row quotes each ratio as the range over the two runs (one value where they agree)."""
    readme = (ROOT / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if "deepseek-v3-fp8-tp8" in ln)
    for i in range(4):
        figure = quoted_range([QUOTED[k][i] for k in RUNS])
        assert figure in row, figure


@pytest.mark.parametrize("run, backend, step", [("first", "flashmla", "36.0"), ("first", "snapmla", "38.5"),
                                                ("first", "flashmla-fp8", "43.2"), ("second", "flashmla", "36.0"),
                                                ("second", "snapmla", "38.5"), ("second", "flashmla-fp8", "43.1")])
def test_decode_step_at_the_peak_is_the_logs(run, backend, step):
    stats = log_stats(read_log(RUNS[run] / f"server_{backend}.log.xz"), min_queue=32)
    assert f"{stats['decode_step_ms_at_peak']:.1f}" == step
    row = next(ln for ln in section_text().splitlines() if ln.startswith(f"| {run} | {LABELS[backend]} |"))
    assert f"{step} ms" in row
    for key in ("decode_tok_s_near_peak", "prefill_tok_s_median"):
        assert f"| {stats[key]:,.0f}".replace(",", " ") in row, (key, row)


def test_the_near_peak_and_prefill_ratios_are_the_logs():
    """The decode and prefill ratios the section's summary and the README quote, from both runs' logs."""
    figures = {"decode_bf16": [], "decode_fp8": [], "prefill_bf16": [], "prefill_fp8": []}
    for folder in RUNS.values():
        st = {b: log_stats(read_log(folder / f"server_{b}.log.xz"), min_queue=32) for b in LABELS}
        for key, stat in (("decode", "decode_tok_s_near_peak"), ("prefill", "prefill_tok_s_median")):
            figures[f"{key}_bf16"].append(f"{st['snapmla'][stat] / st['flashmla'][stat]:.2f}x")
            figures[f"{key}_fp8"].append(f"{st['snapmla'][stat] / st['flashmla-fp8'][stat]:.2f}x")
    quoted = {k: quoted_range(v) for k, v in figures.items()}
    assert quoted == {"decode_bf16": "1.69x", "decode_fp8": "1.04x", "prefill_bf16": "1.41x",
                      "prefill_fp8": "1.79-1.80x"}, quoted
    section = " ".join(section_text().split())
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "deepseek-v3-fp8-tp8" in ln)
    for figure in quoted.values():
        assert figure in section and figure in row, figure


def drew_the_fan_in_weights(text: str) -> bool:
    """Whether a per-GPU V3 server's log (TP 8 or DP attention: 61 layers) shows the deployment draw of its block-FP8
    weights and the KV scales it checked at 1.0."""
    return ("'block_fp8_weights': 482," in text and "'routers': 58, 'lm_heads': 1" in text
            and re.search(r"k_scale = v_scale = 1\.0 on \d+ attention layers \(checked\)", text) is not None)


def test_the_dummy_weight_fix_and_routed_scaling_are_in_every_servers_log():
    for folder in RUNS.values():
        for log in folder.glob("server_*.log.xz"):
            assert drew_the_fan_in_weights(read_log(log)), log.name
    config = json.loads((ROOT / "configs/models/deepseek-v3-fp8-tp8/config.json").read_text())
    assert config["routed_scaling_factor"] == 1.0 and config["num_experts_per_tok"] == 1


def weight_gib(config: dict) -> float:
    """One GPU's weights of a block-FP8 DeepSeek-V3 config, counted from its shapes: FP8 linears (1 B), their fp32
    block scales, BF16 embedding, LM head and routers, and the BF16 w_kc / w_vc SGLang dequantizes kv_b_proj into."""
    c = config
    H, h, L, dense = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["first_k_dense_replace"]
    ql, kl, r, nope, v = (c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                         "v_head_dim"))
    attn = H * ql + H * (kl + r) + ql * h * (nope + r) + kl * h * (nope + v) + h * v * H
    moe = (c["n_routed_experts"] + c["n_shared_experts"]) * 3 * c["moe_intermediate_size"] * H
    fp8 = L * attn + (L - dense) * moe + dense * 3 * c["intermediate_size"] * H
    bf16 = 2 * (2 * c["vocab_size"] * H + (L - dense) * c["n_routed_experts"] * H + L * kl * h * (nope + v))
    return (fp8 * (1 + 4 / 128**2) + bf16) / 2**30


def test_the_tp8_config_is_the_model_the_h200_loaded():
    """The per-GPU config's weights, counted from its shapes, are what SGLang loaded on the H200 (within 1.5 %: one
    expert more per layer is 1.7 % more), and each backend's pool holds its KV bytes per token x 61 layers: 644 B for
    snapmla (the plugin's budget in the memory planner), 1 152 for BF16 and 576 for SGLang's FP8 cache, in the same
    39.63 GB."""
    import json

    config = json.loads((ROOT / "configs/models/deepseek-v3-fp8-tp8/config.json").read_text())
    expected = weight_gib(config)
    for run, per_token in (("snapmla", 644), ("flashmla", 1152), ("flashmla-fp8", 576)):
        text = read_log(RUN / f"server_{run}.log.xz")
        loaded = float(re.search(r"Load weight end\..*?mem usage=([\d.]+) GB", text).group(1))
        assert loaded == pytest.approx(expected, rel=0.015), (run, loaded, expected)
        tokens = int(re.search(r"max_total_num_tokens=(\d+)", text).group(1))
        assert tokens * per_token * config["num_hidden_layers"] / 2**30 == pytest.approx(39.63, abs=0.01), run


@pytest.mark.parametrize("name, measured", [("deepseek-v3-fp8-dp-attention", "v3_fp8_dp_attention_h200_start"),
                                            ("deepseek-v3-fp8-tp8", None), ("kimi-k2-fp8-tp8", None),
                                            ("kimi-k2-fp8-dp-attention", None)])
def test_each_per_gpu_config_fits_one_h200_beside_a_pool_that_binds(name, measured):
    """Every block-FP8 per-GPU config's weights (counted; where an H200 loaded it, as loaded, within 1.5 %) leave
    25-45 GiB of pool in --mem-fraction-static 0.88 of the 139.13 GiB SGLang sees on an H200, ~1.5 GiB going to
    other buffers (the H200 runs: 39.6 GiB predicted 39.1 at TP 8, 29.0 predicted 28.9 under DP attention): room to
    serve, and a pool that binds under the paper's workloads (8k-32k prompts, more requests than BF16's pool holds)."""
    import json

    weights = weight_gib(json.loads((ROOT / "configs/models" / name / "config.json").read_text()))
    if measured:
        text = read_log(ROOT / "results/serve" / measured / "server_snapmla.log.xz")
        loaded = float(re.search(r"Load weight end\..*?mem usage=([\d.]+) GB", text).group(1))
        assert loaded == pytest.approx(weights, rel=0.015), (loaded, weights)
    assert 25 <= 0.88 * 139.13 - weights - 1.5 <= 45, weights


DP_RUN = ROOT / "results/serve/v3_fp8_dp_attention_h200_long"
DP_SECTION = "Block-FP8 weights: DeepSeek-V3/R1 per GPU under DP attention (H200)"
# host A: snapmla and BF16 whole runs (the folder); host B: BF16 and SGLang FP8 whole runs and snapmla stopped at
# 240 s; host C: snapmla and SGLang FP8 whole runs
DP_FOLDERS = {"A": DP_RUN, "B": DP_RUN / "other_host", "C": DP_RUN / "third_host"}
DP_LOGS = {(run, host): DP_FOLDERS[host] / log for run, host, log in (
    ("snapmla", "A", "server_snapmla.log.xz"), ("flashmla", "A", "server_flashmla.log.xz"),
    ("flashmla", "B", "server_flashmla.log.xz"), ("flashmla-fp8", "B", "server_flashmla-fp8.log.xz"),
    ("snapmla 240 s", "B", "snapmla_cut_240s/server_snapmla.log.xz"),
    ("snapmla", "C", "server_snapmla.log.xz"), ("flashmla-fp8", "C", "server_flashmla-fp8.log.xz"))}
DP_LABELS = {"snapmla": "snapmla", "flashmla": "flashmla BF16", "flashmla-fp8": "SGLang FP8 cache",
             "snapmla 240 s": "snapmla, client stopped at 240 s"}
SNAPMLA_RUNS = (("snapmla", "A"), ("snapmla 240 s", "B"), ("snapmla", "C"))  # every run with engine figures


def dp_section() -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[DP_SECTION]


def dp_row(run: str, host: str) -> str:
    return next(ln for ln in dp_section().splitlines() if ln.startswith(f"| {DP_LABELS[run]} | {host} |"))


def dp_readme_row() -> str:
    return next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "deepseek-v3-fp8-dp-attention" in ln)


def dp_stats() -> dict:
    return {key: log_stats(read_log(log), min_queue=32) for key, log in DP_LOGS.items()}


def dp_runs() -> dict:
    return {(r["run"], host): r for host, folder in DP_FOLDERS.items() for r in read_json(folder / "serve_bench.json")}


def test_the_dp_attention_whole_runs_are_one_workload_two_per_backend_on_three_hosts():
    """The three folders hold whole runs of one workload with the DP-attention config (snapmla and BF16 on host A, BF16
    and SGLang FP8 on host B, snapmla and SGLang FP8 on host C), every request completed, outputs text and probes
    finite; each row's output-rate and TTFT ratios against its own host's BF16 run (none on host C), and its TPOT,
    pool, peak, duration, text share and probe, as quoted."""
    from benchmarks.serve_and_bench import non_finite_probe, text_share

    runs = dp_runs()
    assert set(runs) == {("snapmla", "A"), ("flashmla", "A"), ("flashmla", "B"), ("flashmla-fp8", "B"),
                         ("snapmla", "C"), ("flashmla-fp8", "C")}
    assert len({repr(r["workload"]) for r in runs.values()}) == 1
    assert all(r["completed"] == 120 and "error" not in r for r in runs.values())
    assert "deepseek-v3-fp8-dp-attention" in runs["flashmla", "A"]["workload"]["model"]
    for (name, host), r in runs.items():
        row, bf16 = dp_row(name, host), runs.get(("flashmla", host))
        if bf16 and name != "flashmla":
            assert (f"| {r['output_tok_s']:.0f} ({r['output_tok_s'] / bf16['output_tok_s']:.2f}x) | "
                    f"{r['median_ttft_ms'] / 1000:.1f} ({r['median_ttft_ms'] / bf16['median_ttft_ms']:.2f}x) |") in row
        else:
            assert f"| {r['output_tok_s']:.0f} | {r['median_ttft_ms'] / 1000:.1f} |" in row, row
        cells = f"| {r['median_tpot_ms']:.1f} | {r['pool_tokens']:,} | {r['peak_running_req']} |"
        assert cells.replace(",", " ") in row, (name, row)
        assert f"| {r['duration_s']:.1f} | {text_share(r)} | {non_finite_probe(r['endpoints'])} |" in row, (name, row)
        assert f"{r['startup_s']:.1f}" in " ".join(dp_section().split()), (name, r["startup_s"])  # "s to answer"
    readme = dp_readme_row()
    for key, host in (("snapmla", "A"), ("flashmla", "A"), ("snapmla", "C"), ("flashmla-fp8", "C")):
        assert re.search(rf"\b{runs[key, host]['output_tok_s']:.0f}\b", readme) and f"host {host})" in readme, key
    # each backend's two whole runs agree to within 1 %
    for backend in DP_LABELS:
        rates = [r["output_tok_s"] for (name, _), r in runs.items() if name == backend]
        assert len(rates) in (0, 2) and (not rates or max(rates) / min(rates) - 1 < 0.01), (backend, rates)
    assert "each backend's two runs within 1 %" in " ".join(dp_section().split()) + readme


def test_each_dp_rows_engine_figures_are_its_server_log():
    """Every row's step at the peak, near-peak decode rate, prefill median, peak running and prefill phase come from
    its server log; snapmla's stopped run reports its probe as the section says."""
    for (name, host), s in dp_stats().items():
        row = dp_row(name, host)
        assert f"| {s['peak_running']} | {s['decode_step_ms_at_peak']:.1f} ms |" in row, (name, row)
        for figure in (s["decode_tok_s_near_peak"], s["prefill_tok_s_median"]):
            assert f"| {figure:,.0f}".replace(",", " ") in row, (name, figure, row)
        assert f"| {s['prefill_span_s']:.0f} |" in row, (name, row)
    probe = (DP_FOLDERS["B"] / "snapmla_cut_240s/serve_and_bench.out").read_text()
    assert "endpoint probe: 0/16 greedy logprobs not finite" in probe
    assert dp_row("snapmla 240 s", "B").endswith("| 0/16 |")


def test_the_dp_ratios_quoted_are_the_saved_runs():
    """snapmla's output rate and TTFT p50 against BF16's (host A) and SGLang FP8's (host C) on one host, and over every
    pair of whole runs; its near-peak decode, prefill medians and peak running requests against them over every pair
    of runs with engine figures (its stopped run too); its pool against BF16's and SGLang FP8's: in the section (rows
    and summary) and the README."""
    stats, runs = dp_stats(), dp_runs()
    whole = {name: [key for key in runs if key[0] == name] for name in ("snapmla", "flashmla", "flashmla-fp8")}

    def pairs(key, base, table, runs_of_snapmla):
        return quoted_range([f"{table[run][key] / table[b][key]:.2f}x" for run in runs_of_snapmla for b in whole[base]])

    def same_host(key, base, host):
        return f"{runs['snapmla', host][key] / runs[base, host][key]:.2f}x"

    figures = {"output vs BF16": same_host("output_tok_s", "flashmla", "A"),
               "TTFT vs BF16": same_host("median_ttft_ms", "flashmla", "A"),
               "output vs FP8": same_host("output_tok_s", "flashmla-fp8", "C"),
               "TTFT vs FP8": same_host("median_ttft_ms", "flashmla-fp8", "C"),
               "output vs BF16, every pair": pairs("output_tok_s", "flashmla", runs, whole["snapmla"]),
               "output vs FP8, every pair": pairs("output_tok_s", "flashmla-fp8", runs, whole["snapmla"]),
               "TTFT vs BF16, every pair": pairs("median_ttft_ms", "flashmla", runs, whole["snapmla"]),
               "TTFT vs FP8, every pair": pairs("median_ttft_ms", "flashmla-fp8", runs, whole["snapmla"])}
    figures |= {f"{key} vs {label}": pairs(key, base, stats, SNAPMLA_RUNS)
                for key in ("decode_tok_s_near_peak", "prefill_tok_s_median", "peak_running")
                for base, label in (("flashmla", "BF16"), ("flashmla-fp8", "FP8"))}
    assert figures == {"output vs BF16": "1.67x", "TTFT vs BF16": "0.39x", "output vs FP8": "1.61x",
                       "TTFT vs FP8": "0.49x", "output vs BF16, every pair": "1.66-1.68x",
                       "output vs FP8, every pair": "1.59-1.61x", "TTFT vs BF16, every pair": "0.39x",
                       "TTFT vs FP8, every pair": "0.49-0.50x",
                       "decode_tok_s_near_peak vs BF16": "1.35-1.36x", "decode_tok_s_near_peak vs FP8": "0.93x",
                       "prefill_tok_s_median vs BF16": "2.08-2.12x", "prefill_tok_s_median vs FP8": "2.12-2.15x",
                       "peak_running vs BF16": "1.82x", "peak_running vs FP8": "0.90x"}
    summary = " ".join(dp_section().split("\n\n")[1].split())
    readme_row = dp_readme_row()
    for name, figure in figures.items():
        if name != "peak_running vs FP8":  # the section's step analysis gives it ("with 0.90x its requests")
            assert figure in summary and figure in readme_row, (name, figure)
    assert "with 0.90x its requests" in " ".join(dp_section().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    prose = readme[readme.index("The same shape under DP attention (128 heads)"):][:600]
    for name in ("output vs BF16", "TTFT vs BF16", "output vs FP8", "TTFT vs FP8", "output vs BF16, every pair",
                 "output vs FP8, every pair", "decode_tok_s_near_peak vs BF16", "decode_tok_s_near_peak vs FP8"):
        assert figures[name] in prose, (name, prose)
    snap = runs["snapmla", "A"]
    pool = {r: f"{snap['pool_tokens'] / runs[r]['pool_tokens']:.2f}x" for r in (("flashmla", "A"), ("flashmla-fp8", "B"))}
    assert pool == {("flashmla", "A"): "1.79x", ("flashmla-fp8", "B"): "0.89x"}
    assert f"Its pool holds {pool['flashmla', 'A']} BF16's tokens ({pool['flashmla-fp8', 'B']} SGLang FP8's)" in summary
    for run in SNAPMLA_RUNS[:2]:  # host C has no BF16 row
        row, base = dp_row(*run), stats["flashmla", run[1]]
        assert f"({stats[run]['decode_tok_s_near_peak'] / base['decode_tok_s_near_peak']:.2f}x)" in row, row
        assert f"({stats[run]['prefill_tok_s_median'] / base['prefill_tok_s_median']:.2f}x)" in row, row


def tokens_at_peak(log: str) -> float:
    """The mean of the cached tokens (#token) over the decode log lines at the log's peak running requests (a line
    logged as a whole batch finishes counts 0 tokens: left out)."""
    rows = [d for d in decode_lines(log) if d["tokens"]]
    peak = max(d["running"] for d in rows)
    at = [d["tokens"] for d in rows if d["running"] == peak]
    return sum(at) / len(at)


def test_the_attention_share_of_the_dp_step_is_the_kernel_table_scaled_to_the_cached_tokens():
    """The DP section's attention estimate: each backend's kernel time at 128 heads, b128 s_k 4 096 (the kernel
    table's saved run) per cached token, times its tokens cached at the peak and the 61 layers; snapmla's from the
    wave count of its graph's plan instead; the rest of each step is the log's step minus that (BF16's over both of
    its runs)."""
    kernels = {("flashmla", "A"): "flashmla_bf16", ("snapmla", "A"): "snapmla_cuda_sm90",
               ("flashmla-fp8", "B"): "flashmla_fp8_pertensor"}
    table = read_json(ROOT / "results/bench/kernels_h200.json.xz")["results"]
    section = " ".join(dp_section().split())
    stats, ms, tokens = dp_stats(), {}, {}
    for backend, kernel in kernels.items():
        row = next(r for r in table if (r["kernel"], r["h"], r["s_q"], r["b"], r["sk"]) == (kernel, 128, 1, 128, 4096))
        assert f"{row['us']:.1f}" in section, (kernel, row["us"])
        tokens[backend] = tokens_at_peak(read_log(DP_LOGS[backend]))
        ms[backend] = row["us"] / (128 * 4096) * tokens[backend] * 61 / 1000
    bf16, snap, fp8 = kernels
    assert (f"~{ms[bf16]:.1f} ms of BF16's step ({tokens[bf16] / 1000:.0f} k tokens), "
            f"~{ms[snap]:.1f} ms of snapmla's ({tokens[snap] / 1000:.0f} k) and "
            f"~{ms[fp8]:.1f} ms of SGLang FP8's ({tokens[fp8] / 1000:.0f} k)") in section, ms
    # the graph's batch 96 at 2 splits: 3 waves of the pages of one split (kernel table: 1.66 µs a CTA and page)
    pages = math.ceil(tokens[snap] / 82 / 64 / 2)
    waves_ms = 3 * pages * 1.66 * 61 / 1000
    assert f"3 waves of {pages} pages a layer" in section and f"~{waves_ms:.1f} ms" in section, (pages, waves_ms)
    bf16_rest = quoted_range([f"{stats['flashmla', h]['decode_step_ms_at_peak'] - round(ms[bf16], 1):.1f}m"
                              for h in "AB"])[:-1]
    rest = (bf16_rest, f"{stats[snap]['decode_step_ms_at_peak'] - round(waves_ms, 1):.1f}",
            f"{stats[fp8]['decode_step_ms_at_peak'] - round(ms[fp8], 1):.1f}")
    assert (f"leaves {rest[0]} ms of BF16's step, {rest[1]} ms of snapmla's and {rest[2]} ms of SGLang FP8's"
            in section), rest


def test_the_moe_check_table_is_the_saved_run():
    """The section's SGLang-MoE table from results/moe/top1_routed_scaling_h200.json: at 2.5 every block off, at 1.0
    none, the largest outputs and non-finite counts as quoted."""
    rows = json.loads((ROOT / "results/moe/top1_routed_scaling_h200.json").read_text())
    section = " ".join(doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[DP_SECTION].split())
    for factor in (2.5, 1.0):
        out = [r for r in rows if r["routed_scaling_factor"] == factor and not r["inplace"]]
        assert [r["tokens"] for r in out] == [1, 9, 64]
        assert all((r["blocks_off"] == r["blocks"]) == (factor == 2.5) for r in out)
        assert all((r["blocks_off"] == 0) == (factor == 1.0) for r in out)
        if factor == 2.5:
            figures = " / ".join(f"{r['max_abs_sglang']:.2e}".replace("e+", "e") for r in out)
            nonfinite = " / ".join(str(r["non_finite"]) for r in out)
        else:
            figures = " / ".join(f"{r['max_abs_sglang']:.2f}" for r in out)
            nonfinite = "0"
        assert f"| {factor} | 1 / 9 / 64 | {figures} |" in section, figures
        assert f"| {nonfinite} |" in section
    inplace = " / ".join(str(r["non_finite"]) for r in rows if r["routed_scaling_factor"] == 2.5 and r["inplace"])
    assert f"the same blocks off, {inplace} non-finite" in section


def test_the_dp_attention_servers_drew_the_fan_in_weights():
    for log in DP_LOGS.values():
        assert drew_the_fan_in_weights(read_log(log)), log


def test_the_attention_share_of_the_tp8_step_is_the_kernel_table_scaled_to_the_cached_tokens():
    """The section's attention estimate: each backend's kernel time at 16 heads, b128 s_k 16k (the kernel table's
    saved run) per cached token, times the tokens its pool held at the peak (pool x the log's largest token usage)
    and the 61 layers; the rest of the step is the log's step minus that; both as the section quotes them."""
    kernels = {"snapmla": "snapmla_cuda_sm90", "flashmla": "flashmla_bf16", "flashmla-fp8": "flashmla_fp8_pertensor"}
    table = read_json(ROOT / "results/bench/kernels_h200.json.xz")["results"]
    section = " ".join(section_text().split())
    rest = {}
    for backend, kernel in kernels.items():
        row = next(r for r in table if (r["kernel"], r["h"], r["s_q"], r["b"], r["sk"]) == (kernel, 16, 1, 128, 16384))
        assert f"{row['us']:.1f}" in section, (kernel, row["us"])
        run = load("first")[backend]
        stats = log_stats(read_log(RUN / f"server_{backend}.log.xz"), min_queue=32)
        tokens = run["pool_tokens"] * stats["max_token_usage"]
        attention_ms = row["us"] / (128 * 16384) * tokens * 61 / 1000
        assert f"~{attention_ms:.1f} ms for {dict(flashmla='BF16', snapmla='snapmla').get(backend, 'SGLang FP8')}" \
            in section, (backend, attention_ms)
        rest[backend] = f"{stats['decode_step_ms_at_peak'] - round(attention_ms, 1):.1f}"
    assert (f"{rest['flashmla']} ms at 62 requests, {rest['snapmla']} at 112 and {rest['flashmla-fp8']} at 120"
            in section), rest


def test_each_backends_greedy_probe_is_the_same_tokens_in_both_runs():
    """The section's determinism claim: the endpoint probe's 16 greedy tokens of BF16 and of snapmla are identical in
    the two runs (SGLang FP8's second row, rebuilt, keeps no probe), and differ between the backends."""
    ids = {run: {name: r.get("endpoints", {}).get("generate_ids") for name, r in load(run).items()} for run in RUNS}
    for backend in ("flashmla", "snapmla"):
        assert ids["first"][backend] and ids["first"][backend] == ids["second"][backend], backend
    assert ids["first"]["flashmla"] != ids["first"]["snapmla"]
    assert "BF16's endpoint probes are the same tokens in both runs, as are snapmla's" in " ".join(
        section_text().split())


MTP_RUN = ROOT / "results/serve/v3_fp8_dp_attention_h200_mtp"
TP8_MTP_RUN = ROOT / "results/serve/v3_fp8_tp8_h200_mtp_fan_in"
MTP_LABELS = {"snapmla-mtp": "snapmla", "flashmla-mtp": "flashmla BF16", "flashmla-fp8-mtp": "SGLang FP8 cache"}
TP8_MTP_MARKER = "**MTP on the TP 8 shape with the config's routed scaling 1.0"


def mtp_row(run: str, table: str | None = None) -> str:
    table = table if table is not None else dp_section().split("**MTP on this shape")[1]
    return next(ln for ln in table.splitlines() if ln.startswith(f"| {MTP_LABELS[run]} | "))


def expected_mtp_row(name: str, r: dict, bf16: dict | None) -> str:
    """An MTP table's row as the saved run gives it: start, output rate (with its ratio against BF16's where `bf16`
    is given and the row is not BF16's), TPOT, TTFT, pool, accept length, greedy repeat, text share, probe."""
    from benchmarks.serve_and_bench import non_finite_probe, text_share

    ratio = "" if bf16 is None or name == "flashmla-mtp" else f" ({r['output_tok_s'] / bf16['output_tok_s']:.2f}x)"
    return (f"| {MTP_LABELS[name]} | {r['startup_s']:.1f} | {r['output_tok_s']:.0f}{ratio} | {r['median_tpot_ms']:.1f} | "
            f"{r['median_ttft_ms']:,.0f} | {r['pool_tokens']:,} | {r['accept_length']:.2f} | "
            f"{'identical' if r['greedy_repeat']['identical'] else 'differ'} | {text_share(r)} | "
            f"{non_finite_probe(r['endpoints'])} |").replace(",", " ")


def test_the_mtp_table_is_the_saved_run_on_the_dp_shape():
    """Three MTP runs (NEXTN, 2 steps, top-k 1, 3 draft tokens) of one workload on the DP-attention config: each row's
    start, output rate (ratio against BF16's), TPOT, TTFT, pool, accept length, greedy repeat, text share and probe
    as the JSON holds them; the accept length the section explains is 1.00 in every run."""
    from harness.server import MTP

    runs = {r["run"]: r for r in read_json(MTP_RUN / "serve_bench.json")}
    assert set(runs) == set(MTP_LABELS) and len({repr(r["workload"]) for r in runs.values()}) == 1
    assert "deepseek-v3-fp8-dp-attention" in runs["snapmla-mtp"]["workload"]["model"]
    for name, r in runs.items():
        assert " ".join(MTP) in r["cmd"] and r["completed"] == 32 and "error" not in r, name
        assert mtp_row(name) == expected_mtp_row(name, r, runs["flashmla-mtp"]), name
        assert r["accept_length"] == 1.0, name
    assert "accept length 1.00" in " ".join(dp_section().split())


TP8_MTP_WARM_RUN = ROOT / "results/serve/v3_fp8_tp8_h200_mtp_warm_host"
TP8_MTP_WARM_MARKER = "**The same MTP setup with SGLang FP8 beside snapmla, on a warm host"


def tp8_mtp_section() -> str:
    """The TP 8 MTP paragraph of the first run, up to the warm host's."""
    text = section_text()
    return text[text.index(TP8_MTP_MARKER):text.index(TP8_MTP_WARM_MARKER)]


def tp8_mtp_warm_section() -> str:
    text = section_text()
    return text[text.index(TP8_MTP_WARM_MARKER):text.index("### SGL_USE_DEEPGEMM_BMM=1")]


def prefill_rates(log: str, tokens: int = 8192) -> list[float]:
    """The input rates (tokens/s) of a log's prefill batches of `tokens` new tokens, in order."""
    return [field(ln, "input throughput (token/s)") for ln in log.splitlines()
            if (m := BATCH_LINE.match(ln)) and m.group(3) == "Prefill" and field(ln, "#new-token") == tokens]


def k_range(rates: list[float]) -> str:
    return f"{min(rates) / 1e3:.1f}-{max(rates) / 1e3:.1f} k"


def test_the_tp8_mtp_warm_host_table_is_the_saved_run_with_sglang_fp8_beside_snapmla():
    """SGLang FP8 and snapmla with MTP in one command on a warm host: each row as the JSON holds it, the ratios of
    the bold line recomputed from the two rows, the capture times and the prefill rates that set the TTFT ratio read
    from the two server logs, every MTP graph captured at the four sizes."""
    from harness.server import MTP

    runs = {r["run"]: r for r in read_json(TP8_MTP_WARM_RUN / "serve_bench.json")}
    assert set(runs) == {"snapmla-mtp", "flashmla-fp8-mtp"} and len({repr(r["workload"]) for r in runs.values()}) == 1
    assert runs["snapmla-mtp"]["workload"]["model"] == "configs/models/deepseek-v3-fp8-tp8"
    text = tp8_mtp_warm_section()
    flat = " ".join(text.split())
    for name, r in runs.items():
        assert " ".join(MTP) in r["cmd"] and r["completed"] == 32 and r["accept_length"] == 1.0, name
        assert mtp_row(name, text) == expected_mtp_row(name, r, None), name
    s, f = runs["snapmla-mtp"], runs["flashmla-fp8-mtp"]
    assert "--kv-cache-dtype fp8_e4m3" in f["cmd"] and "--attention-backend snapmla" in s["cmd"]
    assert (f"snapmla made {s['output_tok_s'] / f['output_tok_s']:.2f}x its output rate at "
            f"{s['median_tpot_ms'] / f['median_tpot_ms']:.2f}x its TPOT p50 and "
            f"{s['median_ttft_ms'] / f['median_ttft_ms']:.2f}x its TTFT p50") in flat
    logs = {name: read_log(TP8_MTP_WARM_RUN / f"server_{name}.log.xz") for name in runs}
    captures = {name: [f"{startup_report(log)['engine'][f'cuda_graph.{graph}']:.1f} s"
                       for graph in ("target_verify", "draft_decode", "draft_extend")] for name, log in logs.items()}
    c = captures["flashmla-fp8-mtp"]
    assert f"(SGLang FP8 {c[0]}, {c[1]} and {c[2]}," in flat
    c = captures["snapmla-mtp"]
    assert f"snapmla {c[0]}, {c[1]} and {c[2]})" in flat
    rates = {name: prefill_rates(log) for name, log in logs.items()}
    assert all(len(r) == 4 for r in rates.values())
    assert (f"{k_range(rates['flashmla-fp8-mtp'])} tokens/s for SGLang FP8 and {k_range(rates['snapmla-mtp'])} "
            "for snapmla") in flat
    durations = sorted(r["duration_s"] for r in runs.values())
    assert f"(32 requests in {durations[0]:.0f}-{durations[1]:.0f} s)" in flat
    for name, log in logs.items():
        assert drew_the_fan_in_weights(log) and "k_scale = v_scale = 1.0 on 2 attention layers (checked)" in log, name
        for graph, tokens in (("target verify", 3), ("draft decode", 1), ("draft extend", 3)):
            assert (f"Capture {graph} CUDA graph begin. backend=full, num_tokens_per_req={tokens}, "
                    "bs=[1, 8, 16, 32]") in log, (name, graph)
        assert re.search(r"Decode batch, #running-req: 32, .*accept len: 1\.00, .*cuda graph: True", log), name


BMM_RUN = ROOT / "results/serve/v3_fp8_tp8_h200_deepgemm_bmm"
# the three warm-host runs in the section's order: snapmla first, BF16 first (another host), snapmla first again
BMM_RUNS = [BMM_RUN, ROOT / "results/serve/v3_fp8_tp8_h200_deepgemm_bmm_bf16_first",
            ROOT / "results/serve/v3_fp8_tp8_h200_deepgemm_bmm_snapmla_first"]
BMM_FRESH = ROOT / "results/serve/v3_fp8_tp8_h200_deepgemm_bmm_fresh_host"
BMM_FRESH_BF16_FIRST = ROOT / "results/serve/v3_fp8_tp8_h200_deepgemm_bmm_bf16_first_fresh_host"
BMM_LABELS = {"snapmla-deepgemm-bmm": "snapmla", "flashmla-deepgemm-bmm": "flashmla BF16"}


def bmm_section() -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())["SGL_USE_DEEPGEMM_BMM=1"]


def test_the_deepgemm_bmm_rows_ratios_and_prefill_rates_are_the_saved_runs():
    """snapmla and flashmla BF16 with SGL_USE_DEEPGEMM_BMM=1, three runs on warm hosts: each row as its JSON holds it
    (in its command's order), with the 8 192-token prefill rates of its server log; the per-run ratios and the bold
    ranges recomputed; the first run's slow prefill against the later runs' batches after the first; the padded
    head-major layout named in snapmla's logs; README and DEPLOY quoting the same ranges."""
    from benchmarks.serve_and_bench import non_finite_probe, text_share
    from harness.server import DEEPGEMM_BMM_ENV

    text = bmm_section()
    flat = " ".join(text.split())
    env = " ".join(f"{k}={v}" for k, v in DEEPGEMM_BMM_ENV.items())
    assert f"Every run sets `{env}`" in flat
    rows = [ln for ln in text.splitlines() if re.match(r"\| \d \| (snapmla|flashmla BF16) \|", ln)]
    expected, ratios, rates, workloads, first_in_command = [], [], [], set(), []
    for n, folder in enumerate(BMM_RUNS, 1):
        saved = read_json(folder / "serve_bench.json")
        runs = {r["run"]: r for r in saved}
        assert set(runs) == set(BMM_LABELS) and len(saved) == 2, folder
        first_in_command.append(saved[0]["run"])
        logs = {name: read_log(folder / f"server_{name}.log.xz") for name in runs}
        rates.append({name: prefill_rates(log) for name, log in logs.items()})
        for r in saved:
            assert all(f"{k}={v}" in r["cmd"] for k, v in DEEPGEMM_BMM_ENV.items()) and r["completed"] == 32, folder
            workloads.add(repr(r["workload"]))
            batches = rates[-1][r["run"]]
            assert len(batches) == 4, (folder, r["run"])
            expected.append((f"| {n} | {BMM_LABELS[r['run']]} | {r['startup_s']:.1f} | {r['output_tok_s']:,.0f} | "
                             f"{r['median_tpot_ms']:.1f} | {r['median_ttft_ms']:,.0f} | "
                             + " / ".join(f"{x:,.0f}" for x in batches)
                             + f" | {r['pool_tokens']:,} | {text_share(r)} | {non_finite_probe(r['endpoints'])} |"
                             ).replace(",", " "))
        s, b = runs["snapmla-deepgemm-bmm"], runs["flashmla-deepgemm-bmm"]
        ratios.append((s["output_tok_s"] / b["output_tok_s"], s["median_tpot_ms"] / b["median_tpot_ms"],
                       s["median_ttft_ms"] / b["median_ttft_ms"]))
        assert f"| {n} | {ratios[-1][0]:.2f}x | {ratios[-1][1]:.2f}x | {ratios[-1][2]:.2f}x |" in text, n
        assert ("snapmla: q_nope [tokens, heads, 512] arrives head-major, padded: 256 rows per head for 32 tokens "
                "(DeepGEMM's masked GEMM)") in logs["snapmla-deepgemm-bmm"], folder
        assert f"{s['pool_tokens'] / b['pool_tokens']:.2f}x BF16's tokens" in flat
    assert rows == expected and len(workloads) == 1
    # the second run's command lists BF16 first, the others snapmla
    assert first_in_command == ["snapmla-deepgemm-bmm", "flashmla-deepgemm-bmm", "snapmla-deepgemm-bmm"]
    out, tpot, ttft = (quoted_range([f"{r[i]:.2f}x" for r in ratios]) for i in range(3))
    assert (f"snapmla made {out} BF16's output rate at {tpot} its TPOT p50 and {ttft} its TTFT p50") in flat
    first = rates[0]
    assert (f"In the first its 8 192-token prefill batches ran at {k_range(first['snapmla-deepgemm-bmm'])} tokens/s "
            f"against BF16's {k_range(first['flashmla-deepgemm-bmm'])}") in flat
    later_snap = [x for r in rates[1:] for x in r["snapmla-deepgemm-bmm"][1:]]
    later_bf16 = [x for r in rates[1:] for x in r["flashmla-deepgemm-bmm"][1:]]
    assert (f"snapmla's batches after the first ran at {k_range(later_snap)}, BF16's at {k_range(later_bf16)}") in flat
    without = read_log(TP8_MTP_WARM_RUN / "server_snapmla-mtp.log.xz")
    assert (f"(the MTP run above) snapmla's prefill batches ran at {k_range(prefill_rates(without))}") in flat
    snap = read_log(BMM_RUN / "server_snapmla-deepgemm-bmm.log.xz")
    assert "arrives contiguous" in snap and "arrives strides (2097152, 131072, 1)" in snap
    assert "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 8, 16, 32]" in snap
    assert "arrives strides (2097152, 131072, 1)" in flat
    fresh = {r["run"]: r for r in read_json(BMM_FRESH_BF16_FIRST / "serve_bench.json")}
    b = fresh["flashmla-deepgemm-bmm"]
    assert b["completed"] == 32 and "output_tok_s" not in fresh["snapmla-deepgemm-bmm"]
    assert (f"its start took {b['startup_s']:.1f} s and its TTFT p50 was {b['median_ttft_ms'] / 1e3:.1f} s") in flat
    deploy = " ".join((ROOT / "docs/DEPLOY.md").read_text().split())
    assert (f"at {out} flashmla BF16's output rate and {tpot} its TPOT p50 in three runs of 32 requests of 1 024 / "
            f"256 on warm hosts; in the first its prefill batches ran at {k_range(first['snapmla-deepgemm-bmm'])} "
            f"tokens/s against BF16's {k_range(first['flashmla-deepgemm-bmm'])}") in deploy
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"snapmla serves the TP 8 shape at {out} BF16's output rate on 32 short requests (three runs;" in readme


def test_the_deepgemm_bmm_fresh_host_start_is_its_saved_run():
    """The first start with DeepGEMM's JIT: snapmla's capture time, the 103 s of SGLang's own warm-up request between
    capture and ready (stamps and its prefill's logged rate), its start, the warm-up that timed out; BF16's start,
    TTFT and rate after it."""
    runs = {r["run"]: r for r in read_json(BMM_FRESH / "serve_bench.json")}
    s, b = runs["snapmla-deepgemm-bmm"], runs["flashmla-deepgemm-bmm"]
    assert "TimeoutExpired" in s["error"] and "'--random-output-len', '8'" in s["error"] and "output_tok_s" not in s
    flat = " ".join(bmm_section().split())
    log = read_log(BMM_FRESH / "server_snapmla-deepgemm-bmm.log.xz")
    capture = re.search(r"\[\S+ ([\d:]+)\] Capture target decode CUDA graph end\. elapsed=([\d.]+) s", log)
    ready = re.search(r"\[\S+ ([\d:]+)\] The server is fired up", log).group(1)
    first = re.search(r"\[\S+ ([\d:]+)\] Prefill batch, #new-seq: 1, #new-token: 64, .*input throughput "
                      r"\(token/s\): ([\d.]+)", log)
    warm = re.search(r"Prefill batch, #new-seq: 1, #new-token: 1216, .*input throughput \(token/s\): ([\d.]+)", log)
    gap = int(clock_seconds(ready) - clock_seconds(capture.group(1)))
    assert first.group(1) == ready and gap == 103
    assert (f"captured its decode graphs in {float(capture.group(2)):.1f} s (ended {capture.group(1)}), then spent "
            f"{gap} s on SGLang's own 64-token warm-up request (its prefill logged {float(first.group(2)):.2f} "
            f"tokens/s; ready at {ready}) and answered after {s['startup_s']:.1f} s") in flat
    assert f"a 1 216-token prefill that logged {float(warm.group(1)):.1f} tokens/s" in flat
    assert (f"BF16 after it answered in {b['startup_s']:.1f} s and its bench's TTFT p50 was "
            f"{b['median_ttft_ms'] / 1e3:.1f} s ({b['output_tok_s']:.1f} output tokens/s)") in flat


def test_the_tp8_mtp_table_is_the_saved_run_and_says_what_stopped_sglang_fp8():
    """The TP 8 shape's MTP runs: a row per saved run as the JSON holds it (no ratio: a fresh host's first server
    beside a warm one is no comparison, as the text says), the command's model and MTP flags; SGLang FP8's run, which
    has no row, is in the folder as a log that loaded the MTP layer with the KV-scale check, allocated the pool the
    text quotes, began its target-verify capture and never finished it."""
    from harness.server import MTP

    runs = {r["run"]: r for r in read_json(TP8_MTP_RUN / "serve_bench.json")}
    assert set(runs) == {"snapmla-mtp", "flashmla-mtp"} and len({repr(r["workload"]) for r in runs.values()}) == 1
    assert runs["snapmla-mtp"]["workload"]["model"] == "configs/models/deepseek-v3-fp8-tp8"
    section = tp8_mtp_section()
    for name, r in runs.items():
        assert " ".join(MTP) in r["cmd"] and r["completed"] == 32 and r["accept_length"] == 1.0, name
        assert mtp_row(name, section) == expected_mtp_row(name, r, None), name
    assert not any(ln.startswith("| SGLang FP8 cache |") for ln in section.splitlines())
    fp8 = read_log(TP8_MTP_RUN / "server_flashmla-fp8-mtp.log.xz")
    assert "type=DeepseekV3ForCausalLMNextN, quant=fp8" in fp8 and drew_the_fan_in_weights(fp8)
    assert "k_scale = v_scale = 1.0 on 2 attention layers (checked)" in fp8
    pool = re.search(r"KV Cache is allocated\. dtype: torch\.float8_e4m3fn, #tokens: (\d+)", fp8).group(1)
    assert f"an FP8 pool of {int(pool):,} tokens".replace(",", " ") in " ".join(section.split())
    assert "Capture target verify CUDA graph begin" in fp8 and "Capture target verify CUDA graph end" not in fp8
    # snapmla's start holds the host's compiles: its decode built here, a long first capture against BF16's
    snap = read_log(TP8_MTP_RUN / "server_snapmla-mtp.log.xz")
    assert "SnapMLA decode: sm_90a CUDA kernel, built here with nvcc" in snap
    captures = {run: float(re.search(r"Capture target verify CUDA graph end\. elapsed=([\d.]+) s",
                                     read_log(TP8_MTP_RUN / f"server_{run}.log.xz")).group(1))
                for run in ("snapmla-mtp", "flashmla-mtp")}
    assert f"{captures['snapmla-mtp']:.0f} s of target-verify capture against BF16's {captures['flashmla-mtp']:.0f} s" \
        in " ".join(section.split())
    last_capture, ready = (clock_seconds(re.search(r"\[\S+ ([\d:]+)\] " + line, snap).group(1)) for line in
                           ("Capture draft extend CUDA graph end", "The server is fired up"))
    gap = int(ready - last_capture)
    assert f"{gap} s from the last capture to ready" in " ".join(section.split())


def test_every_mtp_server_captured_its_three_graphs_at_each_batch_and_drew_the_fan_in_weights():
    """Target verify (3 tokens a request), draft decode and draft extend captured for batches 1, 8, 16, 32 in each
    server's log; the MTP layer loaded with the deployment draw (k_scale = v_scale = 1.0 checked); the verify steps
    ran in graphs."""
    for folder, run in [(MTP_RUN, run) for run in MTP_LABELS] + [(TP8_MTP_RUN, "snapmla-mtp"),
                                                                  (TP8_MTP_RUN, "flashmla-mtp")]:
        log = read_log(folder / f"server_{run}.log.xz")
        for graph, tokens in (("target verify", 3), ("draft decode", 1), ("draft extend", 3)):
            assert (f"Capture {graph} CUDA graph begin. backend=full, num_tokens_per_req={tokens}, "
                    "bs=[1, 8, 16, 32]") in log, (run, graph)
            assert f"Capture {graph} CUDA graph end." in log, (run, graph)
        assert "type=DeepseekV3ForCausalLMNextN, quant=fp8" in log and "'block_fp8_weights': 8," in log, run
        assert drew_the_fan_in_weights(log) and "k_scale = v_scale = 1.0 on 122 attention layers" in log, run
        assert "k_scale = v_scale = 1.0 on 2 attention layers (checked)" in log, run
        assert re.search(r"Decode batch, #running-req: 32, .*accept len: 1\.00, .*cuda graph: True", log), run
