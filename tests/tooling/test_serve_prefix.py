"""The prefix-heavy serving matrix (benchmarks/serve_prefix.py): the bench_serving command of each workload, the
summary it parses, the table's ratios."""

from pathlib import Path

import pytest

from benchmarks import serve_prefix as sp

SUMMARY = """
Successful requests:                     512
Total generated tokens (retokenized):    141288
Output token throughput (tok/s):         5935.75
Total token throughput (tok/s):          112545.09
Benchmark duration (s):                  24.81
Peak output token throughput (tok/s):    11964.00
Mean TTFT (ms):                          9900.10
Median TTFT (ms):                        9872.89
P99 TTFT (ms):                           10005.20
Median TPOT (ms):                        46.94
Total prompt tokens:                     2354126
Total cached tokens:                     2109760
"""


def test_commands_name_the_datasets_and_the_chat_api_for_conversations():
    shared = sp.bench_command(30000, "m", sp.WORKLOADS["shared-4k"])
    assert shared[shared.index("--dataset-name") + 1] == sp.GSP
    assert shared[shared.index("--gsp-system-prompt-len") + 1] == "4096"
    assert shared[shared.index("--num-prompts") + 1] == str(32 * 16)
    assert shared[shared.index("--backend") + 1] == "sglang" and "--cache-report" in shared
    turns = sp.bench_command(30000, "m", sp.WORKLOADS["multi-turn"])
    assert turns[turns.index("--backend") + 1] == "sglang-oai-chat"  # bench_serving's multi-turn needs chat
    assert turns[turns.index("--gsp-num-turns") + 1] == "6"
    warm = sp.bench_command(30000, "m", sp.WORKLOADS["multi-turn"], warmup=True)
    assert warm[warm.index("--gsp-num-turns") + 1] == "1" and warm[warm.index("--gsp-output-len") + 1] == "8"
    long = sp.bench_command(30000, "m", sp.WORKLOADS["long-64k"])
    assert "--tokenize-prompt" in long and long[long.index("--random-input-len") + 1] == "65536"
    assert sp.bench_command(30000, "m", sp.WORKLOADS["long-64k"], warmup=True)[-1] == "2"


def test_parse_and_table(tmp_path: Path):
    m = sp.parse(SUMMARY)
    assert (m["output_tok_s"], m["p99_ttft_ms"], m["cached_tokens"], m["prompt_tokens"]) == \
        (5935.75, 10005.2, 2109760, 2354126)
    assert (m["mean_ttft_ms"], m["peak_output_tok_s"], m["duration_s"]) == (9900.1, 11964.0, 24.81)
    m.update(gpu_prefill_s=9.33, gpu_decode_s=8.11, prefill_batches=184, prefill_span_s=23.0)
    base = {**m, "output_tok_s": 5000.0, "median_ttft_ms": 12000.0, "mean_ttft_ms": 9000.1}
    fp8 = {**m, "output_tok_s": 2500.0}
    results = {"v2": {"snapmla": {"workloads": {"shared-4k": m}},
                      "flashmla": {"workloads": {"shared-4k": base}, "pool_tokens": 10},
                      "flashmla-fp8": {"workloads": {"shared-4k": fp8}, "error": "long-64k: timeout"}}}
    text = sp.table(results)
    row = next(line for line in text.splitlines() if "| snapmla |" in line)
    assert "| 9.87 / 9.90 / 10.01 |" in row and "| 184 / 23 | 9.33 / 8.11 | 70% |" in row, row
    assert "| 1.19x / 2.37x | 0.82x / 1.10x |" in row, row
    assert "error: long-64k: timeout" in text and "10 tokens" in text
    assert sp.plot(results, tmp_path / "p.png").exists()


@pytest.mark.parametrize("compressed", [False, True])
def test_redraw_reads_the_saved_outputs_again(tmp_path: Path, compressed):
    """A row saved before parse() knew a metric gains it from its bench_serving output, plain or xz-compressed as
    results/ keeps it; the server-side fields stay."""
    import lzma

    row = {"output_tok_s": 1.0, "gpu_prefill_s": 3.0}
    results = {"configs/models/v2": {"snapmla": {"workloads": {"shared-4k": row}}}}
    saved = tmp_path / "bench_v2_snapmla_shared-4k.txt"
    if compressed:
        saved.with_name(saved.name + ".xz").write_bytes(lzma.compress(SUMMARY.encode()))
    else:
        saved.write_text(SUMMARY)
    sp.reparse(results, tmp_path)
    assert (row["mean_ttft_ms"], row["output_tok_s"], row["gpu_prefill_s"]) == (9900.1, 5935.75, 3.0)


def test_the_intake_is_read_from_the_measured_runs_log_lines():
    """prefill_intake: the prefill batches of a log slice, the requests they admitted, the seconds they span and the
    median of their own input rates (a line without one does not count)."""
    from harness.server_log import prefill_intake

    log = "\n".join([
        "[2026-11-27 09:15:31] Prefill batch, #new-seq: 1, #new-token: 1792, #cached-token: 0, #running-req: 0",
        "[2026-11-27 09:15:40] Decode batch, #running-req: 5, #token: 91968, token usage: 0.01, cuda graph: True",
        "[2026-11-27 09:15:52 DP1] Prefill batch, #new-seq: 3, #new-token: 768, #cached-token: 49152, #running-req: 5, "
        "input throughput (token/s): 9000.5",
        "[2026-11-27 09:15:54] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 32768, #running-req: 8, "
        "input throughput (token/s): 4000.0",
    ])
    assert prefill_intake(log) == {"prefill_batches": 3, "prefill_requests": 6, "prefill_span_s": 23.0,
                                   "prefill_tok_s_median": 6500.25}
    assert prefill_intake("no batches") == {"prefill_batches": 0, "prefill_requests": 0, "prefill_span_s": None,
                                            "prefill_tok_s_median": None}
