"""Every cell of the decode-kernel tables in docs/BENCHMARKS.md and docs/BENCHMARKS-H100.md, read back from the
bench_kernels run each names in results/bench/ (µs per kernel, the ratios, TFLOPS, GB/s, the error against FlashMLA
BF16), at the precision the doc prints. A column the test does not know fails, so a new column comes with its check."""

from pathlib import Path

import pytest

from harness.results import read_json
from helpers import cell_numbers, doc_sections, doc_tables, quoted_range, shows

ROOT = Path(__file__).resolve().parents[2]

# (doc, section heading, which of its tables, the run in results/bench/)
TABLES = [
    ("BENCHMARKS.md", "Decode kernel (H200)", 0, "kernels_h200.json"),
    ("BENCHMARKS-H100.md", "Decode kernel (H100)", 0, "kernels_h100.json"),
    ("BENCHMARKS-H100.md", "Decode kernel (H100)", 1, "kernels_h200_heads_8_32_64.json"),
]
KEYS = {"h": "h", "heads": "h", "s_q": "s_q", "b": "b", "batch": "b", "s_k": "sk"}


def _us(kernel):
    return lambda d: [d[kernel]["us"]]


def _ours(d):
    return d.get("snapmla_cuda_sm90", d["snapmla_triton"])  # what bench_kernels' table calls "ours"


COLUMNS = {
    "snapmla_triton us": _us("snapmla_triton"),
    "snapmla_cuda_sm90 us": _us("snapmla_cuda_sm90"),
    "snapmla µs": _us("snapmla_cuda_sm90"),
    "flashmla_bf16 us": _us("flashmla_bf16"),
    "FlashMLA BF16 µs": _us("flashmla_bf16"),
    "flashmla_fp8_pertensor us": _us("flashmla_fp8_pertensor"),
    "FlashMLA FP8 µs": _us("flashmla_fp8_pertensor"),
    "FlashInfer BF16 µs": _us("flashinfer_fa3_bf16"),
    "FlashInfer FP8 µs": _us("flashinfer_fa3_fp8"),
    "ours TFLOPS": lambda d: [_ours(d)["tflops"]],
    "ours GB/s": lambda d: [_ours(d)["gbps"]],
    "ours / FlashMLA BF16": lambda d: [_ours(d)["speedup_vs_flashmla_bf16"]],
    "vs FlashMLA BF16": lambda d: [_ours(d)["speedup_vs_flashmla_bf16"]],
    "ours / FlashMLA FP8": lambda d: [d["flashmla_fp8_pertensor"]["us"] / _ours(d)["us"]],
    "vs FlashMLA FP8": lambda d: [d["flashmla_fp8_pertensor"]["us"] / _ours(d)["us"]],
    "rel err vs BF16": lambda d: [_ours(d)["rel_err_vs_flashmla_bf16"]],
    "Triton µs (vs BF16)": lambda d: [d["snapmla_triton"]["us"], d["snapmla_triton"]["speedup_vs_flashmla_bf16"]],
}


def run_of(name: str) -> dict[tuple, dict]:
    """(h, s_q, b, s_k) -> kernel -> the run's record."""
    out: dict[tuple, dict] = {}
    for r in read_json(ROOT / "results" / "bench" / name)["results"]:
        out.setdefault((r["h"], r["s_q"], r["b"], r["sk"]), {})[r["kernel"]] = r
    return out


def table_of(doc: str, title: str, index: int) -> list[dict[str, str]]:
    section = doc_sections((ROOT / "docs" / doc).read_text())[title]
    return [t for t in doc_tables(section) if "s_q" in t[0]][index]


def mismatches(table: list[dict[str, str]], run: dict[tuple, dict]) -> list[str]:
    out = []
    for row in table:
        key = {KEYS[c]: int(v.replace(" ", "")) for c, v in row.items() if c in KEYS}
        shape = (key["h"], key["s_q"], key["b"], key["sk"])
        assert shape in run, f"{shape}: not in the run"
        for col, cell in row.items():
            if col in KEYS:
                continue
            assert col in COLUMNS, f"a column this test does not check: {col!r}"
            values = COLUMNS[col](run[shape])
            if not shows(cell, values):
                out.append(f"{shape} / {col}: the doc shows {cell!r}, the run {values}")
    return out


@pytest.mark.parametrize("doc, title, index, name", TABLES, ids=[t[3] for t in TABLES])
def test_each_kernel_table_is_its_saved_run(doc, title, index, name):
    section = doc_sections((ROOT / "docs" / doc).read_text())[title]
    assert f"results/bench/{name}" in section, f"the section does not name results/bench/{name}"
    table, run = table_of(doc, title, index), run_of(name)
    assert len(table) == len(run), f"the doc has {len(table)} rows, the run {len(run)} shapes"
    bad = mismatches(table, run)
    assert not bad, "\n".join(bad)


def test_a_changed_cell_is_caught():
    """One printed digit off -- a time, a ratio, the error -- is named."""
    table, run = table_of("BENCHMARKS.md", "Decode kernel (H200)", 0), run_of("kernels_h200.json")
    assert not mismatches(table, run)
    row = next(r for r in table if (r["h"], r["b"], r["s_k"]) == ("16", "128", "16384"))
    for col, new in (("snapmla_cuda_sm90 us", "340.4"), ("ours / FlashMLA BF16", "1.74x"),
                     ("rel err vs BF16", "0.0297"), ("ours GB/s", "3968")):
        changed = [{**r, col: new} if r is row else r for r in table]
        assert [m.split(":")[0] for m in mismatches(changed, run)] == [f"(16, 1, 128, 16384) / {col}"], col


def _kept_h200_records() -> list[dict]:
    """Every kernel record of the H200 bench_kernels runs kept in results/bench/."""
    out = []
    for path in sorted((ROOT / "results" / "bench").glob("kernels_h200*.json*")):
        data = read_json(path)
        out += data.get("results", []) if isinstance(data, dict) else []
    return out


def _shape(record: dict) -> tuple:
    return record["h"], record["s_q"], record["b"], record["sk"]


def _host_spread(records: list[dict]) -> tuple[int, dict]:
    """FlashMLA BF16's time per shape over kernel records of several runs -> (the largest spread between two runs of
    one shape, in whole %, the times per shape measured more than once)."""
    times: dict[tuple, list[float]] = {}
    for r in records:
        if r["kernel"] == "flashmla_bf16":
            times.setdefault(_shape(r), []).append(r["us"])
    repeated = {shape: sorted(us) for shape, us in times.items() if len(us) > 1}
    return round(max(us[-1] / us[0] - 1 for us in repeated.values()) * 100), repeated


def test_the_spread_between_hosts_is_the_kept_runs():
    """"Kernel runs on H200s of one kind differ by up to N %" (BENCHMARKS.md three times, KERNEL.md) is the largest
    spread of FlashMLA BF16's time for one shape between the kept runs, and the figures "Decode kernel (H200)" gives
    for it are those runs' times."""
    records = _kept_h200_records()
    spread, repeated = _host_spread(records)
    assert len(repeated) >= 10, repeated
    benchmarks, kernel = (ROOT / "docs" / "BENCHMARKS.md").read_text(), (ROOT / "docs" / "KERNEL.md").read_text()
    assert f"Kernel runs on\nH200s of one kind differ by up to {spread} %" in kernel, spread
    flat = " ".join(benchmarks.split())
    assert f"kernel runs on H200s of one kind differ by up to {spread} % (\"Decode kernel (H200)\")" in flat
    assert f"Kernel runs on H200s of one kind (other hosts, or one host again) differ by up to {spread} %" in flat
    assert flat.count(f"differ by up to {spread} %") == 3
    section = " ".join(doc_sections(benchmarks)["Decode kernel (H200)"].split())
    widest = max(repeated, key=lambda shape: repeated[shape][-1] / repeated[shape][0])
    assert widest == (16, 1, 1, 640), widest
    quoted = {shape: ["{:,.1f}".format(us).replace(",", " ") for us in repeated[shape]]
              for shape in (widest, (128, 1, 256, 1280), (128, 1, 128, 16384), (16, 1, 64, 65536))}
    b1, short, long, h16 = quoted.values()
    assert f"FlashMLA BF16 took {b1[0]}-{b1[-1]} µs at h16 b1 s_k 640, {short[0]}-{short[-1]} µs at h128 b256 s_k " \
           f"1 280, {long[0]} and {long[-1]} µs at h128 b128 s_k 16k and {h16[0]}-{h16[-1]} µs at h16 b64 s_k 64k" \
           in section, quoted
    ours = sorted((r["us"], r["speedup_vs_flashmla_bf16"]) for r in records
                  if r["kernel"] == "snapmla_cuda_sm90" and _shape(r) == (128, 1, 128, 16384))
    assert len(ours) == 2, ours
    assert (f"the 64-row kernel {ours[0][0]:.1f} and {ours[1][0]:.1f} µs at h128 b128 s_k 16k ({ours[0][1]:.2f}x and "
            f"{ours[1][1]:.2f}x BF16 in its own run)") in section, ours


def test_the_dram_rates_are_the_kept_runs():
    """The DRAM rates the docs read the kernels against are bench_kernels' meta of the kept short-context runs."""
    rates = read_json(ROOT / "results" / "bench" / "kernels_h200_short_context_dram_rates.json.xz")["meta"]
    memcpy = read_json(ROOT / "results" / "bench" / "kernels_h200_short_context_memcpy_rate.json.xz")["meta"]
    read, both, copy = f"{rates['read_tb_s']:.2f}", f"{rates['read_write_tb_s']:.2f}", f"{memcpy['copy_tb_s']:.2f}"
    assert (read, both, copy) == ("4.29", "4.24", "2.75")  # the figures below, as the docs print them
    flat = {name: " ".join((ROOT / name).read_text().split()) for name in ("README.md", "docs/BENCHMARKS.md",
                                                                          "docs/KERNEL.md")}
    assert f"(a sum over 1 GiB reads {read} TB/s there)" in flat["README.md"]
    assert (f"a sum over 1 GiB reads {read} TB/s and an elementwise add reads and writes {both} TB/s, while "
            f"`cudaMemcpy` moves {copy} TB/s read plus write") in flat["docs/BENCHMARKS.md"]
    assert (f"(a sum over 1 GiB: {read} TB/s; an elementwise add, read and write: {both};" in flat["docs/KERNEL.md"]
            and f"`cudaMemcpy` moves less, {copy} TB/s" in flat["docs/KERNEL.md"])
    assert f"92 % of the H200's DRAM read rate, {read} TB/s" in flat["docs/KERNEL.md"]
    assert "copy rate" not in flat["README.md"] + flat["docs/BENCHMARKS.md"]


def test_the_batch_1_split_paragraph_is_the_kept_sweep():
    """KERNEL.md's "Batch 1 by split count (H200)": the counts the cost model picks (today's decode_plan, as in the
    sweep), every time it quotes, and that a server's plans never take the 32 or 64 splits whose combine is slow."""
    import torch

    from sglang_snapmla import decode_plan

    sweep = read_json(ROOT / "results" / "bench" / "split_sweep_h200_batch1.json")
    text = " ".join(doc_sections((ROOT / "docs" / "KERNEL.md").read_text())["What limits it"].split())
    text = text[text.index("**Batch 1 by split count (H200).**"):text.index("**The plan a server makes.**")]

    def us(key, s, part=None):  # decode + combine, or one of them alone (0: decode, 1: combine)
        r = sweep[key]
        return f"{(r['decode_by_splits'][str(s)] if part is None else r['parts_by_splits'][str(s)][part]):.1f}"

    picks = {k: decode_plan.cuda_num_splits(1, int(k[1:k.index("_")]), -(-int(k.rsplit("sk", 1)[1]) // 64),
                                            torch.device("cpu"), sms=132) for k in sweep}
    assert picks == {k: v["default_splits"] for k, v in sweep.items()}
    h128, h16 = ([f"h{h}_b1_sk{sk}" for sk in (640, 1280, 2048)] for h in (128, 16))
    assert [picks[k] for k in h128 + h16[:2]] == [10, 10, 16, 10, 20]
    assert all(min(sweep[k]["decode_by_splits"], key=sweep[k]["decode_by_splits"].get) == str(picks[k])
               for k in h128 + h16[:2])
    assert (f"(10, 10, 16; 10, 20 splits: {us(h128[0], 10)}-{us(h128[2], 16)} and {us(h16[0], 10)}-"
            f"{us(h16[1], 20)} µs)") in text
    assert f"(16 splits, {us('h16_b1_sk2048', 16)} against {us('h16_b1_sk2048', 20)} µs at 20)" in text
    assert f"(32 splits, {us('h16_b1_sk4096', 32)} against {us('h16_b1_sk4096', 48)} µs at 48)" in text
    r = sweep["h128_b1_sk4096"]
    assert (picks["h128_b1_sk4096"] == 22 and f"whole chain {r['full_default']:.1f} µs against FlashMLA BF16's "
            f"{r['flashmla_bf16']:.1f}" in text)
    combine = {s: [v["parts_by_splits"][s][1] for v in sweep.values() if s in v["parts_by_splits"]]
               for s in {s for v in sweep.values() for s in v["parts_by_splits"]}}
    slow = [c for s in ("32", "64") for c in combine[s]]
    rest = [c for s, cs in combine.items() if s not in ("32", "64") for c in cs]
    assert (f"combine alone takes {min(rest):.1f}-{max(rest):.1f} µs from 2 to 48 splits but {min(slow):.1f}-"
            f"{max(slow):.1f} µs at 32 and 64") in text
    assert (f"decode alone is fastest at 32 splits ({us('h16_b1_sk4096', 32, 0)} µs, {us('h16_b1_sk4096', 48, 0)} at "
            f"48) and the combine's {us('h16_b1_sk4096', 32, 1)} µs") in text
    for ctx in (4096, 32768, 163840):
        pages = decode_plan.static_max_pages(ctx)
        counts = {decode_plan.cuda_num_splits(b, s_q * h, pages, torch.device("cpu"), sms=132)
                  for h in (8, 16, 32, 64, 128) for s_q in (1, 2, 3, 4) for b in range(1, 513, 7)}
        assert not counts & {32, 64}, ctx


SHORT_H100 = ("kernels_h100_short_context_serving_plan.json", "kernels_h100_short_context_serving_plan_second_run.json")
SHORT_H100_SWEEP = "split_sweep_h100_short_context.json"


def _shows_range(cell: str, values: list[float]) -> bool:
    """A cell quoting several runs: 'lo-hi', or one figure where both round to it."""
    lo, hi = min(values), max(values)
    return shows(cell, [lo, hi]) if len(cell_numbers(cell)) == 2 else shows(cell, [lo]) and shows(cell, [hi])


def _short_h100():
    section = doc_sections((ROOT / "docs" / "BENCHMARKS-H100.md").read_text())["Decode kernel (H100)"]
    runs = [run_of(name) for name in SHORT_H100]
    # the split table sits in a list item (indented), which doc_tables reads once the indent is gone
    tables = doc_tables("\n".join(line.strip() for line in section.splitlines()))
    bench = next(t for t in tables if "splits" in t[0] and "snapmla µs" in t[0])
    sweep = next(t for t in tables if "1 split" in t[0])
    return section, runs, bench, sweep, read_json(ROOT / "results" / "bench" / SHORT_H100_SWEEP)


def _ratio_range(runs, shape, over) -> str:
    return quoted_range([f"{r[shape][over]['us'] / r[shape]['snapmla_cuda_sm90']['us']:.2f}x" for r in runs])


def test_the_h100_short_context_tables_are_their_kept_runs():
    """BENCHMARKS-H100's short-context table at the serving plan: every cell the range over its two runs, the split
    count each shape ran being the one decode_plan makes for a 32 768-token context; the split table beneath it the
    kept split sweep, the fastest count in bold, the serving plan's count and time beside it; the ratios the text
    draws from both."""
    import torch

    from sglang_snapmla import decode_plan

    section, runs, bench, sweep_rows, sweep = _short_h100()
    assert f"`results/bench/{SHORT_H100[0]}.xz`, `..._second_run.json.xz`" in section
    assert f"`results/bench/{SHORT_H100_SWEEP}`" in section
    assert len(bench) == len(runs[0]) == len(runs[1]) == 14
    us = {"snapmla µs": "snapmla_cuda_sm90", "FlashMLA BF16 µs": "flashmla_bf16",
          "FlashMLA FP8 µs": "flashmla_fp8_pertensor"}
    for row in bench:
        h, b, sk = (int(row[c].replace(" ", "")) for c in ("heads", "batch", "s_k"))
        shape = (h, 1, b, sk)
        ran = {r[shape]["snapmla_cuda_sm90"]["splits"] for r in runs}
        planned = decode_plan.cuda_num_splits(b, h, decode_plan.static_max_pages(32768), torch.device("cpu"), sms=132)
        assert ran == {planned} and shows(row["splits"], [planned]), (shape, ran, planned)
        for col, kernel in us.items():
            assert _shows_range(row[col], [r[shape][kernel]["us"] for r in runs]), (shape, col)
        for col, over in (("vs FlashMLA BF16", "flashmla_bf16"), ("vs FlashMLA FP8", "flashmla_fp8_pertensor")):
            assert row[col].strip("*") == _ratio_range(runs, shape, over), (shape, col, row[col])
    by_shape = {(int(r["heads"]), int(r["batch"]), int(r["s_k"].replace(" ", ""))): r for r in bench}
    assert len(sweep_rows) == len(sweep) == 6
    for row in sweep_rows:
        h, b, sk = (int(row[c].replace(" ", "")) for c in ("heads", "batch", "s_k"))
        r = sweep[f"h{h}_b{b}_sk{sk}"]
        assert shows(row["FlashMLA BF16"], [r["flashmla_bf16"]]), row
        full = r["full_by_splits"]
        for s in full:
            col = "1 split" if s == "1" else s
            assert shows(row[col], [full[s]]) and (row[col].startswith("**") == (s == min(full, key=full.get))), row
        count, times = row["the serving plan's (above)"].partition(": ")[::2]
        assert count == by_shape[(h, b, sk)]["splits"] and times == ("" if count == "1" else
                                                                     by_shape[(h, b, sk)]["snapmla µs"]), row
    flat = " ".join(section.split())

    def fitted(key):
        r = sweep[key]
        return f"{r['flashmla_bf16'] / min(r['full_by_splits'].values()):.2f}x"

    assert (f"h128 b32 s_k 640 would run at {fitted('h128_b32_sk640')} FlashMLA BF16 instead of "
            f"{_ratio_range(runs, (128, 1, 32, 640), 'flashmla_bf16')}, h64 b64 at {fitted('h64_b64_sk640')} instead "
            f"of {_ratio_range(runs, (64, 1, 64, 640), 'flashmla_bf16')} and h64 b32 at {fitted('h64_b32_sk640')} "
            f"instead of {_ratio_range(runs, (64, 1, 32, 640), 'flashmla_bf16')}") in flat


PER_SEQUENCE = "per_sequence_split_counts_h100.json.xz"


def test_the_per_sequence_split_count_table_is_its_kept_runs():
    """KERNEL.md's measurement of per-sequence split counts under a 32k serving plan (not kept): every cell the range
    over the two kept runs, the plan's split count and P as they ran, and the figures the text draws from them (the
    one-split times and those of the counts that leave every 10-page sequence one split)."""
    text = doc_sections((ROOT / "docs" / "KERNEL.md").read_text())["What limits it"]
    assert f"`results/bench/{PER_SEQUENCE}`" in text
    runs = read_json(ROOT / "results" / "bench" / PER_SEQUENCE)["runs"]
    table = next(t for t in doc_tables("\n".join(line.strip() for line in text.splitlines()))
                 if "every sequence over them" in t[0])
    assert len(table) == len([k for k, r in runs[0].items() if r["splits"] > 1]) == 10
    for row in table:
        sk = row["s_k"].replace(" ", "").replace("half", "").replace(",", "+")
        key = f"h{row['heads']}_b{row['batch']}_sk{sk}"
        got = [r[key] for r in runs]
        assert shows(row["splits (32k bound)"], [got[0]["splits"]]) and got[0]["splits"] == got[1]["splits"], key
        for col, field in (("FlashMLA BF16 µs", "flashmla_bf16_us"), ("every sequence over them",
                                                                      "every_sequence_all_splits_us"),
                           ("one split for the batch", "one_split_us")):
            assert _shows_range(row[col], [r[field] for r in got]), (key, col)
        plan, pages = row["per sequence, P"].rstrip(")").split(" (P ")
        assert _shows_range(plan, [r["plan_us"] for r in got]) and int(pages) == got[0]["plan_min_split_pages"], key
    one_split_pages = ("8", "16", "32")  # P at which a 10-page sequence runs one split
    for key in ("h128_b32_sk640", "h64_b64_sk640"):
        times = [r[key]["by_min_split_pages_us"][p] for r in runs for p in one_split_pages]
        ones = [r[key]["one_split_us"] for r in runs]
        assert f"{min(times):.1f}-{max(times):.1f}" in text and f"{min(ones):.1f}-{max(ones):.1f}" in text, key
