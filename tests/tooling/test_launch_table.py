"""tools.kernel_dev.launch_table (Nsight Compute's per-launch metrics of a decode call) and the launch table
docs/KERNEL.md quotes from results/bench/ncu_h128_short_context."""

from pathlib import Path

from helpers import doc_sections
from tools.kernel_dev.launch_table import read, shapes

ROOT = Path(__file__).resolve().parents[2]
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def metric(launch: int, kernel: str, name: str, unit: str, value: str) -> str:
    return (f'"{launch}","1","python3","h","{kernel}","1","7","(128,1,1)","(8,1,1)","0","9.0","m",'
            f'"{name}","{unit}","{value}"')


def test_units_are_converted_and_the_second_call_is_kept():
    """Durations in ns / us become µs, bytes MB, counts with thousands separators numbers; of the two profiled calls
    (launches 0-1 and 2-3) the second's launches are the rows, in order; plan notes attach to their shape."""
    lines = ["# 8 640 128 --impl cuda", HEADER,
             metric(0, "quant", "gpu__time_duration.sum", "us", "90.0"),  # first call: lazy set-up, left out
             metric(1, "decode", "gpu__time_duration.sum", "us", "80.0"),
             metric(2, "quant", "gpu__time_duration.sum", "ns", "3,100"),
             metric(2, "quant", "dram__bytes_read.sum", "Kbyte", "512"),
             metric(3, "decode", "gpu__time_duration.sum", "us", "12.5"),
             metric(3, "decode", "launch__grid_size", "", "16,384"),
             "# 8 640 128 --impl cuda: plan: page bound 10 splits 1",
             "# 8 640 128 --impl flashmla", HEADER,
             metric(4, "flash", "gpu__time_duration.sum", "ns", "1000"),
             metric(5, "flash", "gpu__time_duration.sum", "ns", "2000")]
    (shape, notes, launches), (shape2, _, launches2) = shapes(lines)
    assert shape == "8 640 128 --impl cuda" and notes == ["plan: page bound 10 splits 1"]
    assert [k for k, _ in launches] == ["quant", "decode"]
    assert launches[0][1] == {"gpu__time_duration.sum": 3.1, "dram__bytes_read.sum": 0.512}
    assert launches[1][1] == {"gpu__time_duration.sum": 12.5, "launch__grid_size": 16384.0}
    assert shape2 == "8 640 128 --impl flashmla" and launches2 == [("flash", {"gpu__time_duration.sum": 2.0})]


def test_kernel_md_quotes_the_saved_launches():
    """docs/KERNEL.md's table of launches at 128 heads: snapmla's Q-quant, decode and their sum, FlashMLA BF16's
    kernel + combine, FlashMLA FP8's at b128 s_k 640, each the saved ncu run's (GPU clock, caches flushed)."""
    found = {shape: launches for shape, _, launches in
             read(str(ROOT / "results/bench/ncu_h128_short_context/launches_boost_clock.csv.xz"))}
    section = doc_sections((ROOT / "docs/KERNEL.md").read_text())["What limits it"]

    def us(shape: str) -> list[float]:
        return [m["gpu__time_duration.sum"] for _, m in found[shape]]

    for b, s_k, label in ((64, 640, "h128 b64 s_k 640"), (128, 640, "h128 b128 s_k 640"),
                          (256, 1280, "h128 b256 s_k 1 280")):
        quant, decode = us(f"{b} {s_k} 128 --impl cuda --context-len 32768")
        kernel, combine = us(f"{b} {s_k} 128 --impl flashmla")
        assert [k for k, _ in found[f"{b} {s_k} 128 --impl cuda --context-len 32768"]][0] == "quantize_q_kernel"
        row = next(ln for ln in section.splitlines() if ln.strip().startswith(f"| {label} |") and " = " in ln)
        cells = (f"| {label} | {quant:.1f} | {decode:.1f} | {quant + decode:.1f} | "
                 f"{kernel:.1f} + {combine:.1f} = {kernel + combine:.1f} |")
        assert row.strip().startswith(cells), (row, cells)
    kernel, combine = us("128 640 128 --impl flashmla-fp8")
    assert f"| {kernel:.1f} + {combine:.1f} = {kernel + combine:.1f} |" in section
    quant = found["128 640 128 --impl cuda --context-len 32768"][0][1]
    assert (f"the Q-quant is a third of snapmla's time here**: {quant['gpu__time_duration.sum']:.1f} µs"
            in " ".join(section.split()))
    assert f"DRAM {quant['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.0f} %" in " ".join(section.split())
