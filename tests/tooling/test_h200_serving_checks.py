"""docs/BENCHMARKS.md's "Soak with bad ids", "A prompt above 64k tokens", "Prefill routes with an FP8 kv_b_proj",
"Chat-like traffic at 128 heads (H200, V3 shape)" and "Block-FP8 weights: Kimi-K2 per GPU (H200)": every figure
their tables and prose quote, read back from the runs kept in results/ (bench_serving's JSON, the server log excerpts through `benchmarks.server_log_stats`, the soak's and
the route benchmark's JSON)."""

import re
from pathlib import Path

import pytest

from benchmarks import bench_extend_routes as routes
from benchmarks.server_log_stats import decode_step_fit, log_stats
from harness.results import read_json
from harness.server_log import BATCH_LINE, decode_lines, field, read_log, startup_report
from helpers import clock_seconds as seconds
from helpers import doc_sections
from sglang_snapmla import extend
from tools import soak as soak_tool

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "results/serve/v3_h200_chat"
LONG = ROOT / "results/serve/v3_fp8_dp_attention_h200_mha_chunk"
LABELS = {"snapmla": "snapmla", "flashmla": "flashmla BF16", "flashmla-fp8": "SGLang FP8 cache"}


def section(title: str) -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[title]


def flat(text: str) -> str:
    return " ".join(text.split())


def rows_of(folder: Path) -> dict:
    return {r["run"]: r for r in read_json(folder / "serve_bench.json")}


def n(x: float, fmt: str = ",.0f") -> str:
    return format(x, fmt).replace(",", " ")


CHAT_RUNS = [(CHAT, "0.80", "snapmla"), (CHAT, "0.80", "flashmla"),
             (CHAT / "mem_fraction_060", "0.60", "snapmla"), (CHAT / "mem_fraction_060", "0.60", "flashmla-fp8")]


@pytest.mark.parametrize("folder,fraction,run", CHAT_RUNS)
def test_each_chat_row_is_its_run_and_its_server_log(folder, fraction, run):
    r = rows_of(folder)[run]
    stats = log_stats(read_log(folder / f"server_{run}.log.xz"), min_queue=32)
    row = next(ln for ln in section("Chat-like traffic at 128 heads (H200, V3 shape)").splitlines()
               if ln.startswith(f"| {LABELS[run]} | {fraction} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].split(" (")[0] == n(r["output_tok_s"]) and cells[3].split(" (")[0] == n(r["median_ttft_ms"])
    assert cells[4:8] == [f"{r['median_tpot_ms']:.1f}", f"{r['median_itl_ms']:.1f}", n(r["pool_tokens"]),
                          str(r["peak_running_req"])]
    assert r["completed"] == 512 and r["peak_running_req"] == stats["peak_running"] == 256
    assert cells[8].split(" (")[0] == f"{stats['decode_step_ms_at_peak']:.1f} ms"
    assert cells[9].split(" (")[0] == n(stats["decode_tok_s_near_peak"])
    assert cells[10] == f"{stats['prefill_span_s']:.0f}"
    assert stats["max_token_usage"] <= 0.05  # "the largest token usage any server logged is 5 %"


def test_the_chat_ratios_are_against_the_row_of_the_same_run():
    first, second = rows_of(CHAT), rows_of(CHAT / "mem_fraction_060")
    step = {(f, run): log_stats(read_log(f / f"server_{run}.log.xz"), 32) for f, _, run in CHAT_RUNS}
    text = section("Chat-like traffic at 128 heads (H200, V3 shape)")
    ratio = lambda a, b: f"({a / b:.2f}x)"  # noqa: E731
    snap, bf16, fp8, snap2 = first["snapmla"], first["flashmla"], second["flashmla-fp8"], second["snapmla"]
    for quoted in (ratio(snap["output_tok_s"], bf16["output_tok_s"]), ratio(snap["median_ttft_ms"],
                                                                            bf16["median_ttft_ms"]),
                   ratio(fp8["output_tok_s"], snap2["output_tok_s"]),
                   ratio(fp8["median_ttft_ms"], snap2["median_ttft_ms"])):
        assert quoted in text, quoted
    s1, b1 = step[(CHAT, "snapmla")], step[(CHAT, "flashmla")]
    s2, f2 = step[(CHAT / "mem_fraction_060", "snapmla")], step[(CHAT / "mem_fraction_060", "flashmla-fp8")]
    assert ratio(b1["decode_step_ms_at_peak"], s1["decode_step_ms_at_peak"]) in text
    assert ratio(f2["decode_step_ms_at_peak"], s2["decode_step_ms_at_peak"]) in text
    summary = flat(text.split("**")[1])
    assert ("1.18x flashmla BF16's output rate at 0.85x its TTFT p50" in summary
            and f"{snap['output_tok_s'] / bf16['output_tok_s']:.2f}" == "1.18"
            and f"{snap['median_ttft_ms'] / bf16['median_ttft_ms']:.2f}" == "0.85")
    assert (f"{b1['decode_step_ms_at_peak'] / s1['decode_step_ms_at_peak']:.2f}x BF16's and "
            f"{f2['decode_step_ms_at_peak'] / s2['decode_step_ms_at_peak']:.2f}x SGLang FP8's") in summary
    assert f"{fp8['output_tok_s'] / snap2['output_tok_s']:.2f}x snapmla's output rate" in summary
    assert f"prefill phase {f2['prefill_span_s'] / s2['prefill_span_s']:.1f}x snapmla's" in summary
    assert abs(snap2["output_tok_s"] / snap["output_tok_s"] - 1) < 0.01  # "within 1 % of each other"


def test_the_step_fit_table_is_the_chat_logs_fitted():
    text = section("Chat-like traffic at 128 heads (H200, V3 shape)")
    fits = {}
    for folder, fraction, run in CHAT_RUNS:
        f = decode_step_fit(decode_lines(read_log(folder / f"server_{run}.log.xz")))
        fits[fraction, run] = f
        lo, hi = f["tokens_per_request"]
        assert (f"| {LABELS[run]} | {fraction} | {f['lines']} | {f['fixed_ms']:.2f} | {f['per_request_us']:.1f} | "
                f"{f['rms_ms']:.2f} | {lo:.0f}-{hi:.0f} |") in text
    fixed = [f["fixed_ms"] for f in fits.values()]
    assert f"fixed parts agree within {max(fixed) - min(fixed):.2f} ms" in flat(text)
    per = {k: round(f["per_request_us"], 1) for k, f in fits.items()}
    vs_bf16 = per["0.80", "flashmla"] - per["0.80", "snapmla"]
    vs_fp8 = per["0.60", "flashmla-fp8"] - per["0.60", "snapmla"]
    assert f"{vs_bf16:.1f} µs a step against BF16 ({vs_bf16 * 256 / 1000:.1f} ms at 256) and {vs_fp8:.1f} µs" \
        in flat(text)


def test_sglang_fp8_ran_out_of_memory_at_the_default_fraction():
    r = rows_of(CHAT)["flashmla-fp8"]
    log = read_log(CHAT / "server_flashmla-fp8.log.xz")
    assert r["completed"] is None and "CUDA out of memory. Tried to allocate 24.21 GiB" in log
    assert "flashinfer_mla_backend.py" in log and "24.2 GiB asked" in section("Chat-like traffic at 128 heads (H200, "
                                                                               "V3 shape)")


def test_the_long_prompt_rows_are_the_runs():
    rows = rows_of(LONG)
    snap, bf16 = rows["snapmla-mha"], rows["flashmla"]
    assert snap["completed"] == 2 and bf16["completed"] is None
    text = section("A prompt above 64k tokens")
    row = next(ln for ln in text.splitlines() if ln.startswith("| snapmla, MHA route |"))
    assert f"| {n(snap['median_ttft_ms'])} | {n(snap['pool_tokens'])} |" in row
    assert f"| {n(bf16['pool_tokens'])} |" in next(ln for ln in text.splitlines() if ln.startswith("| flashmla BF16 |"))
    snap_log, bf16_log = read_log(LONG / "server_snapmla-mha.log.xz"), read_log(LONG / "server_flashmla.log.xz")
    bound = f"snapmla: SGLANG_MAX_KV_CHUNK_CAPACITY={extend.mha_chunk_capacity(128)} (SGLang's default 131072)"
    assert bound in snap_log and bound in row
    assert "an illegal memory access was encountered" in bf16_log and "forward_normal_one_shot_core" in bf16_log
    chunks = [ln for ln in bf16_log.splitlines() if "Prefill batch" in ln and "#new-token: 8192" in ln]
    assert len(chunks) == 7 and "tokens 49 152-57 343" in flat(text)  # the last chunk scheduled before it died
    # snapmla prefilled the 79 936-token prompt (its chunks), hit it in the radix cache, then the 79 616-token one
    new = [int(ln.split("#new-token: ")[1].split(",")[0]) for ln in snap_log.splitlines() if "Prefill batch" in ln]
    assert new[-21:] == [8192] * 9 + [6208] + [64] + [8192] * 9 + [5888]
    assert 9 * 8192 + 6208 == 79936 and 9 * 8192 + 5888 == 79616 and "79 936 and 79 616 tokens" in flat(text)


def test_the_route_table_is_the_saved_fp8_run():
    rows = read_json(ROOT / "results/bench/extend_routes_fp8_h200.json")
    text = section("Prefill routes with an FP8 kv_b_proj (H200)")
    for line in routes.table(rows).splitlines()[2:]:
        assert line in text, line
    measured_over_model = sorted(r["snapmla_mha_us"] / r["predicted_mha_us"] for r in rows if r["heads"] == 128)
    short = [x for x in measured_over_model if round(x, 2) >= 1.15]
    assert len(short) == 7 and f"{short[0]:.2f}-{short[-1]:.2f}x the model's in seven" in flat(text)
    near = next(r for r in rows if (r["heads"], r["requests"], r["prefix"], r["new"]) == (128, 16, 4096, 512))
    assert f"MHA's by {100 * (near['snapmla_absorbed_us'] / near['snapmla_mha_us'] - 1):.0f} %" in flat(text)
    fitted = routes.fit_route_costs(rows)
    assert f"{100 * (fitted.mha_upproj / extend.ROUTE_COSTS.mha_upproj - 1):.0f} % above" in flat(text)
    assert f"({fitted.mha_upproj:.2e} against" in flat(text)
    behind = sorted(min(r["snapmla_absorbed_us"], r["snapmla_mha_us"]) / r["flashmla_bf16_absorbed_us"] for r in rows
                    if r["flashmla_bf16_absorbed_us"] < min(r["snapmla_absorbed_us"], r["snapmla_mha_us"]))
    assert f"in {len(behind)} of the 20 cases snapmla's faster route takes {behind[0]:.2f}-{behind[-1]:.2f}x" in flat(text)
    for r in rows:  # "no case's pick changes" under the FP8 run's own fit
        absorbed, mha = extend.route_costs([r["prefix"]] * r["requests"], [r["new"]] * r["requests"], r["heads"],
                                           fitted)
        assert ("absorbed" if absorbed < mha else "mha") == r["picks"], r


def test_the_soak_table_and_verdicts_are_the_saved_soak():
    folder = ROOT / "results/serve/soak_snapmla_fp8_tp8_h200"
    soak = read_json(folder / "soak.json")
    text = section("Soak with bad ids")
    st = soak["statuses"]
    assert f"| complete | 200: {n(st['complete']['200'])}; no answer: {st['complete']['0']} |" in text
    for kind in ("cut", "abort"):
        assert st[kind] == {"200": st[kind]["200"]} and f"| {kind} | 200: {n(st[kind]['200'])} |" in text
    assert st["malformed"] == {"400": 330} and not soak["unexplained"] and "| malformed | 400: 330, each" in text
    failed = [name for name, ok in soak["checks"].items() if not ok]
    assert failed == ["no 5xx or broken connection for well-formed requests"]  # "every check but one"
    complete = st["complete"]["200"] + st["complete"]["0"]
    assert f"{st['complete']['0']} of {n(complete)} whole-response requests" in flat(text)
    assert soak["clients"] == 160 and soak["seconds"] == 240 and soak["retracted_requests"] == 0
    assert soak["idle_used_tokens"] == 0 and soak["health"] == 200 and soak["tracebacks"] == 0
    assert soak["probes_after"] == soak["probes_before"] and soak["flush_status"] == 200
    stamps = [t for t, _ in batch_lines(folder, "server_excerpt.log.xz")]
    gap = next(i for i in range(1, len(stamps)) if stamps[i] == "06:16:50")
    assert stamps[gap - 1] == "06:15:19" and "(06:15:19-06:16:50 in the excerpt)" in flat(text)


SOAKS = {kind: ROOT / f"results/serve/soak_snapmla_fp8_tp8_h200_{kind}"
         for kind in ("second_server", "fresh_host", "deepgemm_jit")}


def start_times(folder: Path) -> dict:
    """From a soak's log excerpt: its start (`startup_report`: first log line to ready, the decode capture's
    seconds) and the time of day of the start, of ready, of the capture's end and of each DeepGEMM shape's compile."""
    log = read_log(folder / "server_excerpt.log.xz")
    stamp = lambda pattern: re.search(r"\[\d{4}-\d\d-\d\d ([\d:]+)\] " + pattern, log).group(1)
    report = startup_report(log)
    return {"start": stamp("server_args="), "ready": stamp("The server is fired up"),
            "ready_s": round(report["log_to_ready_s"]), "capture_s": report["engine"]["cuda_graph.decode"],
            "capture_end": stamp("Capture target decode CUDA graph end"),
            "deepgemm": re.findall(r"\[\S+ ([\d:]+)\] Try DeepGEMM JIT Compiling for <\w+> N=(\d+), K=(\d+)", log)}


def test_the_passing_soak_and_the_fresh_hosts_are_their_saved_runs():
    """"Soak with bad ids": the passing soak's table and sentences, the fresh host's start, gap and load, and the
    DeepGEMM start, each as soak.json and the log excerpt of its run have them."""
    text = flat(section("Soak with bad ids"))
    passing = read_json(SOAKS["second_server"] / "soak.json")
    st = passing["statuses"]
    for kind in ("complete", "cut", "abort"):
        assert st[kind] == {"200": st[kind]["200"]} and f"| {kind} | 200: {n(st[kind]['200'])} |" in text
    assert st["malformed"] == {"400": st["malformed"]["400"]} and not passing["unexplained"]
    assert f"| malformed | 400: {n(st['malformed']['400'])}, each with a message |" in text
    assert all(passing["checks"].values()) and "passes every check of the soak" in text
    assert passing["clients"] == 160 and passing["retracted_requests"] == 0 and passing["idle_used_tokens"] == 0
    assert passing["probes_after"] == passing["probes_before"] and passing["health"] == 200
    assert passing["warmup_statuses"]["complete"] == {"200": 284} and "warm-up's 284 whole-response" in text
    assert f"left the measured load {passing['load_s']} s of the {passing['seconds_asked']:.0f} asked" in text
    assert f"--finish-by {passing['finish_by']:.0f}" in text and passing["load_s"] / 60 == pytest.approx(2.5, abs=0.05)
    times = start_times(SOAKS["second_server"])
    assert f"ready {times['ready_s']} s after its start (decode graphs captured in {times['capture_s']:.1f} s)" in text
    # the fresh host's first server
    fresh = read_json(SOAKS["fresh_host"] / "soak.json")
    assert [name for name, ok in fresh["checks"].items() if not ok] == ["a measured load of at least 60 s within "
                                                                        "--finish-by"]
    assert f"the load left was {fresh['load_s']} s" in text and f"leaves its load {fresh['load_s']:.0f} s" in text
    assert fresh["warmup_statuses"]["complete"] == {"-1": 90} and "none of the warm-up's 90 whole-response" in text
    times = start_times(SOAKS["fresh_host"])
    assert f"ready {times['ready_s']} s after its start (decode graphs {times['capture_s']:.1f} s)" in text
    lines = batch_lines(SOAKS["fresh_host"], "server_excerpt.log.xz")
    after = [t for t, _ in lines if t > times["ready"]]
    gap = max(range(1, len(after)), key=lambda i: seconds(after[i]) - seconds(after[i - 1]))
    took = seconds(after[gap]) - seconds(after[gap - 1])
    assert f"no batch for {took:.0f} s from the warm-up's first prefills ({after[gap - 1]}-{after[gap]} in the" in text
    second_prefill = [t for t, ln in lines if "Prefill batch" in ln and field(ln, "#new-token") == 8192][1]
    whole = seconds(second_prefill) - seconds(times["start"])
    assert f"({times['start']}-{second_prefill}) took {whole:.0f} s" in text and f"take {whole / 60:.1f} minutes" in text
    # DeepGEMM's JIT on a fresh host
    times = start_times(SOAKS["deepgemm_jit"])
    inside = [c for c in times["deepgemm"] if c[0] < times["capture_end"]]
    later = [c for c in times["deepgemm"] if c[0] > times["capture_end"]]
    assert len(later) == 1 and later[0][0] < times["ready"]
    n_, k_ = later[0][1:]
    assert f"for {len(inside)} GEMM shapes inside its first decode-graph capture ({times['capture_s']:.0f} s)" in text
    assert f"and for a 7th (N {n(int(n_))}, K {n(int(k_))}) at its first request, and was ready {times['ready_s']} s" \
        in text and len(inside) + 1 == 7
    # DEPLOY's start-up paragraph and the "By question" start-up row quote the same starts
    fresh_ready = start_times(SOAKS["fresh_host"])["ready_s"]
    deploy = flat((ROOT / "docs/DEPLOY.md").read_text())
    assert f"inside its first capture ({times['capture_s']:.0f} s) and a 7th at its first request, and was ready " \
        f"after {times['ready_s']} s, against {fresh_ready} s for the same start without DeepGEMM" in deploy
    row = next(ln for ln in (ROOT / "docs/BENCHMARKS.md").read_text().splitlines()
               if ln.startswith("| How long does a server take to start? |"))
    assert f"with DeepGEMM's JIT {times['ready_s']} s as a fresh host's first (8 decode-graph sizes;" in row
    idle = read_json(SOAKS["deepgemm_jit"] / "soak.json")
    assert f"read {idle['idle_used_tokens']:.0f} tokens in use after a 20 s idle" in text
    assert f"refuses an idle wait under {soak_tool.MIN_IDLE_SECONDS} s" in text


def batch_lines(folder: Path, name: str) -> list[tuple[str, str]]:
    """(time of day, line) of each Prefill / Decode batch line of a server log excerpt."""
    return [(m.group(1).split()[1], ln) for ln in read_log(folder / name).splitlines() for m in [BATCH_LINE.match(ln)]
            if m]


def test_the_second_soak_is_its_saved_soak_and_its_probes_ran_where_the_log_says():
    folder = ROOT / "results/serve/soak_snapmla_fp8_tp8_h200_warmup"
    soak = read_json(folder / "soak.json")
    text = flat(section("Soak with bad ids"))
    st = soak["statuses"]
    for kind in ("complete", "cut", "abort"):
        assert st[kind] == {"200": st[kind]["200"]} and f"| {kind} | 200: {n(st[kind]['200'])} |" in text
    assert st["malformed"] == {"400": 340} and not soak["unexplained"] and "| malformed | 400: 340, each" in text
    assert [name for name, ok in soak["checks"].items() if not ok] == ["probes after == before"]
    assert soak["seconds"] == 180 and soak["clients"] == 160 and soak["retracted_requests"] == 0
    assert soak["warmup_statuses"]["complete"] == {"-1": 90} and "none of its 90 whole-response" in text
    before, after = soak["probes_before"], soak["probes_after"]
    differ = [i for i in range(8) if before[i] != after[i]]
    assert differ == [0, 1, 2] and "differed from the probes before in 3 of 8" in text
    assert all(before[i][0] == after[i][0] and before[i][1] != after[i][1] for i in differ)  # "from its second token"
    # the probes before: eight one-sequence prefills of their prompts' page-rounded lengths, in order
    lengths = [-(-len(p) // 64) * 64 for p in soak_tool.probe_prompts(soak["vocab"], 8, seed=0)]
    lines = batch_lines(folder, "server_excerpt.log.xz")
    prefills = [(t, ln) for t, ln in lines if "Prefill batch" in ln]
    start = next(i for i in range(len(prefills) - 7) if all(
        "Prefill batch, #new-seq: 1," in prefills[i + k][1] and field(prefills[i + k][1], "#new-token") == lengths[k]
        for k in range(8)))
    probes = prefills[start:start + 8]
    assert [field(ln, "#running-req") for _, ln in probes] == [38, 32, 5, 0, 0, 0, 0, 0]
    assert f"({probes[0][0]}-{probes[-1][0]}, " in text
    assert ", ".join(map(str, lengths[:-1])) + f" and {lengths[-1]} tokens" in text
    assert "logged 38, 32 and 5 running requests for the first three and none for the other five" in text
    stamps = [t for t, _ in lines]
    gap = stamps.index("10:03:49")
    assert stamps[gap - 1] == "10:01:50" and "no batch from 10:01:50 to 10:03:49 in the excerpt" in text


KIMI = {"TP 8, 8 heads": ROOT / "results/serve/kimi_k2_fp8_tp8_h200",
        "DP attention, 64 heads": ROOT / "results/serve/kimi_k2_fp8_dp_attention_h200"}


@pytest.mark.parametrize("shape", KIMI)
def test_each_kimi_row_is_its_run(shape):
    rows = rows_of(KIMI[shape])
    text = section("Block-FP8 weights: Kimi-K2 per GPU (H200)")
    for run, label in LABELS.items():
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {shape} | {label} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        if run not in rows:  # SGLang FP8 at TP 8: started, its bench stopped by the command's limit
            assert shape == "TP 8, 8 heads" and run == "flashmla-fp8" and cells[4] == "not run"
            log = read_log(KIMI[shape] / "server_flashmla-fp8.log.xz")
            assert all(f'"POST {ep} HTTP/1.1" 200' in log for ep in ("/generate", "/v1/completions",
                                                                     "/v1/chat/completions"))
            assert "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1813056" in log
            printed = (KIMI[shape] / "serve_and_bench.out").read_text()  # its start, as serve_and_bench printed it
            assert f"serve_and_bench: flashmla-fp8: answered in {cells[2]} s;" in printed and cells[3] == "1 813 056"
            continue
        assert_kimi_row(cells, rows[run], KIMI[shape] / f"server_{run}.log.xz")


def assert_kimi_row(cells: list[str], r: dict, log: Path) -> None:
    """A Kimi-K2 table row's cells after shape and backend as the saved run gives them; the run's 64 requests
    decoded to text, its probe finite, its server log with the KV-scale check."""
    assert cells[2:] == [f"{r['startup_s']:.1f}", n(r["pool_tokens"]), n(r["output_tok_s"]),
                         n(r["median_ttft_ms"]), f"{r['median_tpot_ms']:.1f}", str(r["peak_running_req"])]
    assert r["completed"] == 64 and round(r["retokenized_output_tokens"] / r["output_tokens"], 2) == 1.09
    assert not any(x != x for x in r["endpoints"]["generate_logprobs"]) and r["endpoints"]["chat"]
    assert "k_scale = v_scale = 1.0 on 82 attention layers (checked)" in read_log(log)


def test_the_kimi_ratios_and_the_first_servers_compiles():
    text = flat(section("Block-FP8 weights: Kimi-K2 per GPU (H200)"))
    dp = rows_of(KIMI["DP attention, 64 heads"])
    s, b, f = dp["snapmla"], dp["flashmla"], dp["flashmla-fp8"]
    assert (f"made {s['output_tok_s'] / b['output_tok_s']:.2f}x flashmla BF16's and "
            f"{s['output_tok_s'] / f['output_tok_s']:.2f}x SGLang FP8's output rate at "
            f"{s['median_tpot_ms'] / b['median_tpot_ms']:.2f}x and {s['median_tpot_ms'] / f['median_tpot_ms']:.2f}x "
            "their TPOT p50") in text
    for rows in (rows_of(folder) for folder in KIMI.values()):
        assert f"{rows['snapmla']['pool_tokens'] / rows['flashmla']['pool_tokens']:.2f}x" == "1.79x"
    assert f"{1612992 / dp['flashmla']['pool_tokens']:.2f}x" == "2.00x" and "SGLang FP8's 2.00x" in text
    # snapmla at TP 8, the host's first server: two slow 8 192-token prefill batches among 17
    rates = {}
    for run in ("snapmla", "flashmla"):
        lines = [ln for _, ln in batch_lines(KIMI["TP 8, 8 heads"], f"server_{run}.log.xz")
                 if "#new-token: 8192" in ln]
        rates[run] = sorted(field(ln, "input throughput (token/s)") for ln in lines)
    slow, fast = rates["snapmla"][:2], rates["snapmla"][2:]
    assert len(rates["snapmla"]) == len(rates["flashmla"]) == 17 and "17 prefill batches of 8 192 tokens" in text
    assert f"ran at {slow[1] / 1e3:.1f} and {slow[0] / 1e3:.1f} k tokens/s" in text
    assert f"other 15 ran at {fast[0] / 1e3:.0f}-{fast[-1] / 1e3:.0f} k" in text
    bf = rates["flashmla"]
    assert f"(BF16's 17 at {bf[0] / 1e3:.0f}-{bf[-1] / 1e3:.0f} k)" in text
    # "By question": the first server's start and the others'
    printed = (KIMI["TP 8, 8 heads"] / "serve_and_bench.out").read_text()
    starts = [r["startup_s"] for folder in KIMI.values() for r in rows_of(folder).values()]
    starts.append(float(printed.split("flashmla-fp8: answered in ")[1].split(" s;")[0]))
    first, later = starts[0], starts[1:]
    assert first == max(starts) and (f"Kimi-K2's 41-layer block-FP8 shares {first:.0f} s first, "
                                     f"{min(later):.0f}-{max(later):.0f} s after") in flat(section("By question"))


KIMI_WARM = ROOT / "results/serve/kimi_k2_fp8_tp8_h200_warm_host"


def test_the_kimi_warm_host_rows_are_their_runs_and_draw_no_ratio():
    """SGLang FP8 and snapmla at TP 8 on a warm host, two commands merged into one folder: each row as the JSON
    holds it (one workload), both logs with the KV-scale check, and no ratio between the two in the text."""
    rows = rows_of(KIMI_WARM)
    assert set(rows) == {"snapmla", "flashmla-fp8"} and len({repr(r["workload"]) for r in rows.values()}) == 1
    text = section("Block-FP8 weights: Kimi-K2 per GPU (H200)")
    warm = text[text.index("**At TP 8 on a warm host"):]
    for run, r in rows.items():
        row = next(ln for ln in warm.splitlines() if ln.startswith(f"| TP 8, 8 heads, warm host | {LABELS[run]} |"))
        assert_kimi_row([c.strip() for c in row.strip("|").split("|")], r, KIMI_WARM / f"server_{run}.log.xz")
        assert r["workload"]["input_len"] == 2048
    assert "no ratio is drawn" in flat(warm) and not re.search(r"\d\.\d\dx", warm)


PREPARED = ROOT / "results/serve/prepare_sampled_no_compiler_h200"
GREEDY_PREPARED = ROOT / "results/serve/soak_snapmla_no_compiler_h200"


def prepare_report(folder: Path) -> dict:
    """What `python -m sglang_snapmla.prepare` printed in a run of tools/gpu_host/no_compiler.sh: its seconds to
    ready and in all, what it sent, and the MB of each cache folder it filled."""
    text = read_log(folder / "prepare.log.xz")
    return {"ready_s": int(re.search(r"^ready after (\d+) s$", text, re.M).group(1)),
            "done_s": int(re.search(r"^done in (\d+) s;", text, re.M).group(1)),
            "sent": re.search(r"^sent: (.*)$", text, re.M).group(1),
            "mb": {m.group(1): float(m.group(2))
                   for m in re.finditer(r"^\| ([^|]+?) \| \w+ \| \S+ \| ([\d.]+) \|$", text, re.M)}}


def test_the_prepared_no_compiler_start_is_its_saved_run():
    """DEPLOY's check of a prepared image without nvcc: prepare's times, its FlashInfer folder against the greedy-only
    prepare's, the sampled requests it sent; the server on those caches with no nvcc, its start from its first log
    line to ready, the prebuilt decode, and a soak of 160 clients whose every check passed."""
    deploy = flat((ROOT / "docs/DEPLOY.md").read_text())
    now, before = prepare_report(PREPARED), prepare_report(GREEDY_PREPARED)
    flashinfer = "FlashInfer JIT (SGLang's norms, sampling, prefill)"
    assert "sampled prompts (top-k and top-p; min-p)" in now["sent"] and "sampled" not in before["sent"]
    assert (f"On a fresh H200 `prepare` took {now['done_s']} s (the server ready after {now['ready_s']} s) and filled "
            f"{now['mb'][flashinfer]} MB of FlashInfer kernels ({before['mb'][flashinfer]} MB in the same table where "
            "it sent greedy requests only)") in deploy
    assert "no nvcc on PATH" in (PREPARED / "compiler.txt").read_text()
    assert "hidden in a private mount namespace" in (PREPARED / "hiding.txt").read_text()
    lines = read_log(PREPARED / "server_lines.log.xz")  # the server's first line, its decode, ready, its last
    assert lines.splitlines()[0].split("] ", 1)[1].startswith("server_args=")
    assert "SnapMLA decode: sm_90a CUDA kernel, prebuilt library" in lines
    soak = read_json(PREPARED / "soak.json")
    assert len(soak["checks"]) == 7 and all(soak["checks"].values()) and soak["tracebacks"] == 0
    assert (f"a snapmla server started on those caches in {startup_report(lines)['log_to_ready_s']:.0f} s on the prebuilt "
            f"sm_90a decode and passed a {soak['load_s'] / 60:.0f}-minute soak of {soak['clients']} clients") in deploy
    assert f"the soak ran as the script runs it, {soak['seconds']:.0f} s," in deploy
