"""The block-FP8 serving runs the README and docs/BENCHMARKS.md quote (results/serve/v3_fp8_tp8_h200_long_fanin:
weights with a spread of 1 / sqrt(fan-in), what SNAPMLA_DUMMY_WEIGHTS=deployment draws; results/serve/
v3_fp8_tp8_h200_long: FP8 weights drawn U(+-1e-3); results/serve/v3_fp8_dp_attention_h200_long: the 128-head
shape under DP attention) give the figures they print: ratios recomputed from the saved JSON and the server-log
excerpts."""

import json
import re
from pathlib import Path

import pytest

from benchmarks.server_log_stats import log_stats
from harness.results import read_json
from harness.server_log import read_log
from helpers import doc_sections

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results/serve/v3_fp8_tp8_h200_long"
RUNS = {"fan-in": ROOT / "results/serve/v3_fp8_tp8_h200_long_fanin", "U(+-1e-3)": RUN}
# per draw: snapmla's output rate / BF16's, its TTFT p50 / BF16's, its output rate / SGLang FP8's
QUOTED = {"fan-in": ("1.33x", "0.83x", "1.04x"), "U(+-1e-3)": ("1.33x", "0.75x", "1.10x")}
SECTION = "Block-FP8 weights: DeepSeek-V3/R1 per GPU at TP 8 (H200)"


def load(draw: str) -> dict:
    return {r["run"]: r for r in read_json(RUNS[draw] / "serve_bench.json")}


def section_text() -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[SECTION]


def test_one_workload_three_backends_per_draw():
    workloads = set()
    for draw in RUNS:
        runs = load(draw)
        assert set(runs) == {"snapmla", "flashmla", "flashmla-fp8"}
        workloads |= {repr(r["workload"]) for r in runs.values()}
        assert all(r["completed"] == 120 and "error" not in r for r in runs.values())
    assert len(workloads) == 1 and "deepseek-v3-fp8-tp8" in workloads.pop()


@pytest.mark.parametrize("draw", RUNS)
def test_docs_quote_the_ratios_of_the_saved_runs(draw):
    runs = load(draw)
    snap, bf16, fp8 = runs["snapmla"], runs["flashmla"], runs["flashmla-fp8"]
    ratios = {"out_bf16": snap["output_tok_s"] / bf16["output_tok_s"],
              "ttft_bf16": snap["median_ttft_ms"] / bf16["median_ttft_ms"],
              "out_fp8": snap["output_tok_s"] / fp8["output_tok_s"]}
    quoted = tuple(f"{r:.2f}x" for r in ratios.values())
    assert quoted == QUOTED[draw], ratios
    # a streamed TTFT is only bench_serving's where the outputs decode to text from the first tokens: the docs
    # compare snapmla's and BF16's, not the FP8 cache's, whose outputs decode to almost none in both runs
    for r in (snap, bf16):
        assert r["retokenized_output_tokens"] > 0.9 * r["output_tokens"], r["run"]
    assert fp8["retokenized_output_tokens"] < 0.01 * fp8["output_tokens"]
    section = section_text()
    for figure in quoted:
        assert figure in section, figure
    rows = [ln for ln in section.splitlines() if ln.startswith(f"| {draw} |")]
    assert len(rows) == 3
    for r in runs.values():  # the table's pool and peak columns
        assert any(f"{r['pool_tokens']:,}".replace(",", " ") in ln and f"| {r['peak_running_req']} |" in ln
                   for ln in rows), r["run"]


def test_readme_row_gives_the_range_of_both_runs():
    """The README's block-FP8 row quotes each ratio as the range over the two draws (one value where they agree)."""
    readme = (ROOT / "README.md").read_text()
    row = next(ln for ln in readme.splitlines() if "deepseek-v3-fp8-tp8" in ln)
    for i in range(3):
        lo, hi = sorted({QUOTED[d][i] for d in RUNS})[0], sorted({QUOTED[d][i] for d in RUNS})[-1]
        figure = lo if lo == hi else f"{lo[:-1]}-{hi}"
        assert figure in row, figure


@pytest.mark.parametrize("draw, run, step", [("fan-in", "flashmla", "36.6"), ("fan-in", "snapmla", "39.7"),
                                             ("fan-in", "flashmla-fp8", "26.3"), ("U(+-1e-3)", "flashmla", "32.5"),
                                             ("U(+-1e-3)", "snapmla", "35.7"), ("U(+-1e-3)", "flashmla-fp8", "26.0")])
def test_decode_step_at_the_peak_is_the_logs(draw, run, step):
    stats = log_stats(read_log(RUNS[draw] / f"server_{run}.log.xz"), min_queue=32)
    assert f"{stats['decode_step_ms_at_peak']:.1f}" == step
    row = next(ln for ln in section_text().splitlines()
               if ln.startswith(f"| {draw} | {dict(flashmla='flashmla BF16', snapmla='snapmla').get(run, 'SGLang')}"))
    assert f"{step} ms" in row
    assert f"{stats['decode_tok_s_near_peak']:,.0f}".replace(",", " ") in row


def test_the_dummy_weight_fix_is_in_every_servers_log():
    for draw, folder in RUNS.items():
        for log in folder.glob("server_*.log.xz"):
            text = read_log(log)
            assert re.search(r"k_scale = v_scale = 1\.0 on \d+ attention layers \(checked\)", text), log.name
            assert "'block_fp8_weights': 482" in text, log.name
            # the fan-in draw also redraws the 58 MoE routers and the LM head; the U(+-1e-3) one did not
            assert ("'routers': 58, 'lm_heads': 1" in text) == (draw == "fan-in"), (draw, log.name)


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
DP_LOGS = {"snapmla": DP_RUN / "server_snapmla.log.xz", "flashmla": DP_RUN / "server_flashmla.log.xz",
           "flashmla_cut": DP_RUN / "flashmla_cut/server_flashmla.log.xz"}


def test_the_dp_attention_run_gives_the_figures_its_section_and_the_readme_quote():
    """Under DP attention (128 heads): the output-rate ratio from the saved JSON, the decode steps, the near-peak
    decode rates and the prefill-batch rates from the server logs (BF16's client-stopped run included), the share of
    outputs with text and the NaN probe, each in the section's table and the README's row."""
    from benchmarks.serve_and_bench import non_finite_probe, text_share

    runs = {r["run"]: r for r in read_json(DP_RUN / "serve_bench.json")}
    assert set(runs) == {"snapmla", "flashmla"} and len({repr(r["workload"]) for r in runs.values()}) == 1
    assert all(r["completed"] == 120 and "error" not in r for r in runs.values())
    assert "deepseek-v3-fp8-dp-attention" in runs["snapmla"]["workload"]["model"]
    stats = {name: log_stats(read_log(log), min_queue=32) for name, log in DP_LOGS.items()}
    snap, bf16 = stats["snapmla"], stats["flashmla"]
    figures = {"output": f"{runs['snapmla']['output_tok_s'] / runs['flashmla']['output_tok_s']:.2f}x",
               "decode": f"{snap['decode_tok_s_near_peak'] / bf16['decode_tok_s_near_peak']:.2f}x",
               "prefill": f"{snap['prefill_tok_s_median'] / bf16['prefill_tok_s_median']:.2f}x",
               "running": f"{snap['peak_running'] / bf16['peak_running']:.2f}x"}
    assert figures == {"output": "1.60x", "decode": "0.90x", "prefill": "2.08x", "running": "1.82x"}, figures
    section = doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[DP_SECTION]
    readme = (ROOT / "README.md").read_text()
    readme_row = next(ln for ln in readme.splitlines() if "deepseek-v3-fp8-dp-attention" in ln)
    for figure in figures.values():
        assert figure in section and figure in readme_row, figure
    rows = {"snapmla": "| snapmla |", "flashmla": "| flashmla BF16 |", "flashmla_cut": "| flashmla BF16, client"}
    for name, start in rows.items():
        row = next(ln for ln in section.splitlines() if ln.startswith(start))
        s = stats[name]
        assert f"| {s['decode_step_ms_at_peak']:.1f} ms |" in row, (name, row)
        assert f"| {s['decode_tok_s_near_peak']:,.0f}".replace(",", " ") in row, (name, row)
        assert f"| {s['prefill_tok_s_median']:,.0f}".replace(",", " ") in row, (name, row)
        if name in runs:
            assert f"| {text_share(runs[name])} | {non_finite_probe(runs[name]['endpoints'])} |" in row, (name, row)
    nan_share = {name: f"{100 * (1 - float(text_share(r))):.0f} %" for name, r in runs.items()}
    assert nan_share == {"snapmla": "26 %", "flashmla": "86 %"}
    assert "BF16 86 %, snapmla 26 %" in readme_row
    assert "86 % of BF16's output tokens and 26 % of snapmla's" in " ".join(section.split())


def test_the_dp_run_with_routed_scaling_one_gives_its_row():
    """The config as it is now (routed scaling 1.0): snapmla's server log of a run stopped in its bench, its step,
    near-peak rate and prefill median in the section's row and the README's row; the fan-in draw in its log."""
    log = read_log(DP_RUN / "snapmla_factor1_cut/server_snapmla.log.xz")
    s = log_stats(log, min_queue=32)
    section = doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[DP_SECTION]
    row = next(ln for ln in section.splitlines() if ln.startswith("| snapmla, routed scaling 1.0"))
    assert f"| {s['decode_step_ms_at_peak']:.1f} ms |" in row and s["peak_running"] == 82
    for figure in (f"{s['decode_tok_s_near_peak']:,.0f}", f"{s['prefill_tok_s_median']:,.0f}"):
        assert f"| {figure.replace(',', ' ')} |" in row, (figure, row)
    readme_row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                      if "deepseek-v3-fp8-dp-attention" in ln)
    assert f"was {s['decode_step_ms_at_peak']:.1f} ms" in readme_row
    assert "'block_fp8_weights': 482" in log and "k_scale = v_scale = 1.0 on 122 attention layers (checked)" in log


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
        text = read_log(log)
        assert "'block_fp8_weights': 482" in text and "'routers': 58, 'lm_heads': 1" in text, log
        assert re.search(r"k_scale = v_scale = 1\.0 on \d+ attention layers \(checked\)", text), log
