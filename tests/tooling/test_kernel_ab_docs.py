"""docs/KERNEL.md's H200 A/B rows quote their runs in results/bench/. "What is in the schedule, and why": every
"before → after" pair of a row (a time, or the range of the two interleaved rounds) is one shape's of the run, and each
head count's percentage range is the run's over its shapes. "Tried and not kept": the in-kernel Q-quant row's and the
persistent-units row's times and changes are their two runs'."""

import csv
import io
import lzma
import re
import statistics
from pathlib import Path

import pytest

from harness.results import read_json
from helpers import doc_sections, doc_tables

ROOT = Path(__file__).resolve().parents[2]


def _rounds(name: str) -> tuple[list[dict], list[dict]]:
    """(rounds of the schedule before, rounds of the schedule in this tree): shape -> µs per round."""
    d = read_json(ROOT / "results" / "bench" / name)
    if "us" in d:
        u = d["us"]
        return [u["replaced softmax"], u["replaced softmax #2"]], [u["this kernel"], u["this kernel #2"]]
    if "main" in d:
        return [d["base"], d["base#2"]], [d["main"], d["main#2"]]
    if "two_fragment_sets" in d:
        return d["one_fragment_set"], d["two_fragment_sets"]

    def by_shape(rows):
        return {f"h{r['h']}x{r['b']}x{r['sk']}": r["us"] for r in rows if r["kernel"] == "snapmla_cuda_sm90"}
    return [by_shape(d["published_after_next_qk"])], [by_shape(d["published_at_once"])]


def _shown(values: list[float]) -> set[str]:
    """How a doc may print these times: the range of the rounds in whole µs ('391-396', '100'), a half rounded
    either way."""
    ends = [{int(v + 0.5), int(v)} if abs(v - int(v) - 0.5) < 1e-9 else {round(v)} for v in (min(values), max(values))]
    return {f"{lo:,}".replace(",", " ") if lo == hi else f"{lo}-{hi}".replace(",", " ")
            for lo in ends[0] for hi in ends[1]}


def kernel_table(section: str) -> list[dict[str, str]]:
    """The first table of a docs/KERNEL.md section."""
    return doc_tables(doc_sections((ROOT / "docs" / "KERNEL.md").read_text())[section])[0]


def rows_with_runs() -> list[tuple[str, str]]:
    out = []
    for row in kernel_table("What is in the schedule, and why"):
        effect = list(row.values())[1]
        m = re.search(r"results/bench/(kernels_h200_\w+_ab)\.json", effect)
        if m and effect.startswith("H200"):
            out.append((f"{m.group(1)}.json", effect))
    return out


PAIR = re.compile(r"(\d{1,3}(?: \d{3})*(?:-\d+)?) → (\d{1,3}(?: \d{3})*(?:-\d+)?)")  # "391-396 → 360-363"


def times_of(effect: str) -> str:
    """The row without what names a shape (heads, s_q, batch and keys), so that 's_q 2 394' is not read as 2 394."""
    return re.sub(r"s_q \d|h\d+|b\d+ s_k \d+k", "", effect)


def mismatches(name: str, effect: str) -> list[str]:
    before, after = _rounds(name)
    pairs = {(b, a) for shape in before[0] for b in _shown([r[shape] for r in before])
             for a in _shown([r[shape] for r in after])}
    bad = [f"{m.group(1)} → {m.group(2)}" for m in PAIR.finditer(times_of(effect))
           if (m.group(1), m.group(2)) not in pairs]
    for m in re.finditer(r"h(\d+) (-\d+\.\d) to (-\d+\.\d) %", effect):
        change = sorted(100 * (after[0][s] / before[0][s] - 1) for s in before[0] if s.startswith(f"h{m.group(1)}x"))
        if {f"{change[0]:.1f}", f"{change[-1]:.1f}"} != {m.group(2), m.group(3)}:
            bad.append(f"h{m.group(1)} {m.group(2)} to {m.group(3)} %: the run's {change[0]:.1f} to {change[-1]:.1f}")
    return bad


@pytest.mark.parametrize("name, effect", rows_with_runs(), ids=[n for n, _ in rows_with_runs()])
def test_each_h200_ab_row_quotes_its_run(name, effect):
    assert len(PAIR.findall(times_of(effect))) == effect.count("→") >= 2  # every pair read
    bad = mismatches(name, effect)
    assert not bad, bad


def test_the_rows_with_runs_are_found_and_a_changed_time_is_caught():
    rows = dict(rows_with_runs())
    assert len(rows) == 4
    softmax = rows["kernels_h200_narrow_softmax_ab.json"].replace("391-396 → 360-363", "391-396 → 361-363")
    assert mismatches("kernels_h200_narrow_softmax_ab.json", softmax)
    p8 = rows["kernels_h200_p8_publication_ab.json"]
    assert mismatches("kernels_h200_p8_publication_ab.json", p8.replace("h64 -2.0 to", "h64 -2.1 to"))


Q_QUANT_RUN = "kernels_h200_q_quant_in_decode_ab.json.xz"
Q_QUANT_ROUNDS = "kernels_h200_q_quant_in_decode_rounds.json.xz"  # the second run: four interleaved rounds
Q_QUANT_ROW = "Q quantized in the 64-row kernel's prologue"


def tried_row(first_cell: str) -> str:
    """The "Tried and not kept" row whose variant starts so, its cells joined."""
    rows = [" | ".join(r.values()) for r in kernel_table("Tried and not kept")
            if list(r.values())[0].startswith(first_cell)]
    assert len(rows) == 1, first_cell
    return rows[0]


def _changes(times: dict, *shapes) -> list[float]:
    """Per shape (h, b, s_k): the in-kernel chain's time against the Q-quant launch's, in per cent."""
    return [100 * (times[k][0] / times[k][1] - 1) for k in shapes]


def _span(values: list[float]) -> str:
    return f"{min(values):.1f} to {max(values):.1f} %"


def _thousands(us: float) -> str:
    return f"{round(us):,}".replace(",", " ")


def bench_times(name: str) -> dict[tuple[int, int, int], dict[str, float]]:
    """A bench_kernels run in results/bench/: (heads, batch, s_k) -> kernel -> µs."""
    t = {}
    for r in read_json(ROOT / "results" / "bench" / name)["results"]:
        t.setdefault((r["h"], r["b"], r["sk"]), {})[r["kernel"]] = r["us"]
    return t


def q_quant_mismatches(row: str) -> list[str]:
    """What the in-kernel Q-quant row should print, from its two runs, that the row does not: the first run's
    short-context times beside FlashMLA BF16's (timed in it), the 64k pair, each group's change range and the share of
    1.15x FlashMLA BF16; the second run's medians over its interleaved rounds."""
    t = bench_times(Q_QUANT_RUN)
    inside, launch = "snapmla_cuda_sm90", "snapmla_cuda_sm90_q_quant_launch"
    first = {k: (v[inside], v[launch]) for k, v in t.items() if launch in v}
    short = [(128, b, 640) for b in (64, 128, 256)]

    def join(key):
        return " / ".join(f"{t[k][key]:.1f}" for k in short)
    long = (128, 64, 65536)
    b128 = t[(128, 128, 640)]
    need = b128[launch] - b128["flashmla_bf16"] / 1.15
    want = [f"{join(inside)} vs {join(launch)} µs ({_span(_changes(first, *short))};",
            f"FlashMLA BF16 {join('flashmla_bf16')})",
            f"h128 s_k 1 280-2 048 {_span(_changes(first, (128, 128, 1280), (128, 256, 1280), (128, 128, 2048)))}",
            f"h64 s_k 640-2 048 {_span(_changes(first, *[k for k in first if k[0] == 64 and k[2] <= 2048]))}",
            f"{_thousands(first[long][0])} vs {_thousands(first[long][1])} µs ({_changes(first, long)[0]:+.1f} %)",
            f"({b128[launch] - b128[inside]:.1f} of {need:.1f} µs)"]
    second = {(r["h"], r["b"], r["sk"]): (statistics.median(r["in_kernel"]), statistics.median(r["launch"]))
              for r in read_json(ROOT / "results" / "bench" / Q_QUANT_ROUNDS)["rows"]}
    want += [f"h128 s_k 640 {_span(_changes(second, *short))}",
             "s_k 1 280 {:.1f} / {:.1f} %".format(*_changes(second, (128, 128, 1280), (128, 256, 1280))),
             "b128 s_k 2 048 {:+.1f} %".format(*_changes(second, (128, 128, 2048))),
             "b64 s_k 16k {:+.1f} %".format(*_changes(second, (128, 64, 16384))),
             f"b64 s_k 64k {_thousands(second[long][0])} vs {_thousands(second[long][1])} µs "
             f"({_changes(second, long)[0]:+.1f} %)",
             f"h64 {_span(_changes(second, *[k for k in second if k[0] == 64]))}",
             f"({(second[long][0] - second[long][1]) / (long[2] / 64) * 1000:.0f} ns a page at 64k)"]
    return [w for w in want if w not in row]


def test_the_q_quant_in_decode_row_quotes_its_run():
    row = tried_row(Q_QUANT_ROW)
    assert not q_quant_mismatches(row), q_quant_mismatches(row)
    assert q_quant_mismatches(row.replace("1 793 vs", "1 794 vs"))
    assert q_quant_mismatches(row.replace("1 776 vs", "1 775 vs"))


PERSISTENT_RUN = "kernels_h100_persistent_units_ab.json"  # time_variants: main = the persistent grid, base = this tree
PERSISTENT_BENCH = "kernels_h100_persistent_units_bench.json"  # bench_kernels with the persistent grid built
PERSISTENT_ROW = "persistent grid of 64-row units"


def persistent_mismatches(row: str) -> list[str]:
    """What the persistent-units row should print from its two runs and does not: per shape the rounds' range of both
    kernels and the change of the medians; per bench shape the ratio to FlashMLA BF16 and both times."""
    before, after = _rounds(PERSISTENT_RUN)
    want = []
    for shape in before[0]:
        b, a = [r[shape] for r in before], [r[shape] for r in after]
        shown = [f"{x} vs {y}" for x in _shown(a) for y in _shown(b)]
        if not any(s in row for s in shown):
            want.append(f"{shape}: one of {shown}")
        change = f"{100 * (statistics.median(a) / statistics.median(b) - 1):+.1f} %"
        if shape != "h128x64x640" and change not in row:  # b64 is not persistent: its pair alone is quoted
            want.append(f"{shape}: {change}")
    t = bench_times(PERSISTENT_BENCH)
    ours, bf16 = zip(*[(v["snapmla_cuda_sm90"], v["flashmla_bf16"]) for _, v in sorted(t.items())])
    want += [" / ".join(f"{f / o:.2f}x" for o, f in zip(ours, bf16)) + " BF16",
             ", ".join(f"{o:.1f} vs {f:.1f}" for o, f in zip(ours, bf16)) + " µs"]
    return [w for w in want if w not in row]


PERSISTENT_NCU = ROOT / "results" / "bench" / "ncu_persistent_units"  # profile.sh at h128 b128 s_k 16k, both kernels


def ncu_metric(details: str, name: str, unit: str = r"\S+") -> tuple[str, str]:
    """One metric of an ncu details page, the first with that name and unit: (unit, value as printed)."""
    unit, value = re.search(rf"^ +{re.escape(name)} +({unit})? +([\d,.]+)$", details, re.M).groups()
    return unit or "", value.replace(",", "")


def barrier_wait_samples(sass_csv: str) -> int:
    """Long-scoreboard stall samples on the softmax warpgroup's mbarrier-wait branches (BRAs its 4 warps run once a
    page: 4 x 128 x 512 = 262 144 executions at most at b128 s_k 16k, fewer where a page skips the wait)."""
    from tools.kernel_dev.stall_regions import read_source_page

    hdr, data = read_source_page(sass_csv)
    col = {h: i for i, h in enumerate(hdr)}
    once_a_page = [r for r in data if 250_000 <= int(r[col["Instructions Executed"]] or 0) <= 262_144]
    return sum(int(r[col["stall_long_sb"]] or 0) for r in once_a_page if " BRA " in f" {r[col['Source']]} ")


def _span_m(values: list[float], digits: int = 1, unit: float = 1e6, name: str = " M") -> str:
    """The runs' range (one value where they agree) in units of `unit`, as the row prints it."""
    lo, hi = (f"{v / unit:.{digits}f}" for v in (min(values), max(values)))
    return f"{lo}{name}" if lo == hi else f"{lo}-{hi}{name}"


def persistent_ncu_mismatches(row: str) -> list[str]:
    """What the row should print from the two kept ncu runs and does not."""
    got = {}
    for kernel in ("base", "persistent"):
        details = lzma.open(PERSISTENT_NCU / f"{kernel}_h128_b128_16k.details.txt.xz", "rt").read()
        unit, duration = ncu_metric(details, "Duration")
        seconds = float(duration) * {"us": 1e-6, "ms": 1e-3}[unit]
        rate = float(ncu_metric(details, "Memory Throughput", "Tbyte/s")[1])
        got[kernel] = dict(duration=float(duration), unit=unit, dram=rate * 1e12 * seconds / 1e9,
                           l2=ncu_metric(details, "L2 Hit Rate")[1], l1=ncu_metric(details, "L1/TEX Hit Rate")[1],
                           local=float(ncu_metric(details, "Local Memory Spilling Requests")[1]),
                           waits=barrier_wait_samples(
                               lzma.open(PERSISTENT_NCU / f"{kernel}_h128_b128_16k.sass.csv.xz", "rt").read()))
        runs = [{r["Metric Name"]: float(r["Metric Value"].replace(",", ""))
                 for r in csv.DictReader(io.StringIO(lzma.open(f, "rt").read()))}
                for f in sorted(PERSISTENT_NCU.glob(f"{kernel}_h128_b128_16k.memory*.csv.xz"))]
        got[kernel].update({name: [run[name] for run in runs] for name in runs[0]})  # each metric: one value a run
    p, b = got["persistent"], got["base"]
    reads = "lts__t_sectors_aperture_device_op_read.sum"
    loaded, stored = (p[f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}_lookup_miss.sum"] for op in ("ld", "st"))
    want = [f"{p['duration']:g} {p['unit']} against {round(b['duration'])} µs",
            f"{p['dram']:.2f} GB read from DRAM against {b['dram']:.2f} GB",
            f"L2 hit rate {p['l2']} against {b['l2']} %",
            f"{p['local'] / b['local']:.1f}x the local-memory requests ({p['local'] / 1e6:.2f} M against "
            f"{b['local'] / 1e6:.2f} M, L1/TEX hit rate {p['l1']} against {b['l1']} %;",
            f"{p['waits'] / b['waits']:.1f}x the long-scoreboard samples ({_thousands(p['waits'])} against "
            f"{_thousands(b['waits'])})",
            f"its L2 serves {_span_m(p[reads])} read sectors against {_span_m(b[reads])} (two runs of the one-unit "
            f"kernel) while its local memory past L1 is {_span_m([x + y for x, y in zip(loaded, stored)], 2)} sectors "
            f"({_span_m(loaded, 2)} loaded, {_span_m(stored, 2)} stored)",
            f"DRAM reads {_span_m(p['dram__bytes_read.sum'], 2, 1e9, ' GB')} against "
            f"{_span_m(b['dram__bytes_read.sum'], 2, 1e9, ' GB')}, writes "
            f"{_span_m(p['dram__bytes_write.sum'], 0, 1e6, ' MB')} against "
            f"{_span_m(b['dram__bytes_write.sum'], 0, 1e6, ' MB')}"]
    return [w for w in want if w not in row]


def test_the_persistent_units_row_quotes_its_runs():
    row = tried_row(PERSISTENT_ROW)
    assert not persistent_mismatches(row), persistent_mismatches(row)
    assert not persistent_ncu_mismatches(row), persistent_ncu_mismatches(row)
    assert persistent_ncu_mismatches(row.replace("1.95 GB", "1.94 GB"))
    assert persistent_ncu_mismatches(row.replace("(5 869 against 861)", "(5 869 against 862)"))
    assert persistent_ncu_mismatches(row.replace("(0.69 M loaded", "(0.68 M loaded"))
    assert persistent_mismatches(row.replace("67 vs 57", "66 vs 57"))
    assert persistent_mismatches(row.replace("(+13.0 %)", "(+12.0 %)"))
    assert persistent_mismatches(row.replace("0.90x", "0.91x"))
