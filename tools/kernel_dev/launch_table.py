"""The table tools/gpu_host/profile_launches.sh prints: one row per kernel launch of the last profiled decode of each
shape, from Nsight Compute's `--csv --metrics` lines (one line per metric). usage: python -m
tools.kernel_dev.launch_table FILE.csv[.xz]"""

import csv
import lzma
import sys
from pathlib import Path

TIME = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}  # -> µs
SIZE = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}  # -> MB
COLUMNS = (("us", "gpu__time_duration.sum"), ("grid", "launch__grid_size"), ("block", "launch__block_size"),
           ("waves", "launch__waves_per_multiprocessor"), ("regs", "launch__registers_per_thread"),
           ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
           ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"), ("DRAM MB read", "dram__bytes_read.sum"),
           ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"))
COUNTS = {"launch__grid_size", "launch__block_size", "launch__registers_per_thread"}


def value(unit: str, text: str) -> float:
    """A metric in µs (times), MB (sizes) or as printed (counts, percentages)."""
    return float(text.replace(",", "")) * TIME.get(unit, SIZE.get(unit, 1.0))


def shapes(lines: list[str]) -> list[tuple[str, list[str], list[tuple[str, dict]]]]:
    """[(shape, notes, [(kernel, {metric: value}) for each launch of the last profiled call])] in file order. The
    profiled range holds two calls with the same launches; the second's are kept (the first may pay lazy set-up)."""
    found, header = [], None
    for line in lines:
        if line.startswith("# ") and ": plan:" not in line:
            found.append((line[2:].strip(), [], {}))
        elif line.startswith("# "):
            found[-1][1].append(line.split(": ", 1)[1].strip())
        elif line.startswith('"') and found:
            row = next(csv.reader([line]))
            if row[0] == "ID":
                header = row
                continue
            r = dict(zip(header, row))
            launch = found[-1][2].setdefault(int(r["ID"]), (r["Kernel Name"], {}))
            launch[1][r["Metric Name"]] = value(r.get("Metric Unit", ""), r["Metric Value"])
    out = []
    for shape, notes, launches in found:
        ids = sorted(launches)
        out.append((shape, notes, [launches[i] for i in ids[len(ids) // 2:]]))
    return out


def read(path: str) -> list:
    raw = Path(path).read_bytes()
    return shapes((lzma.decompress(raw) if path.endswith(".xz") else raw).decode().splitlines())


def main(path: str) -> None:
    print("| shape | kernel | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("|---|---|" + "---:|" * len(COLUMNS))
    for shape, notes, launches in read(path):
        for kernel, m in launches:
            cells = [("-" if k not in m else f"{m[k]:.0f}" if k in COUNTS else f"{m[k]:.1f}") for _, k in COLUMNS]
            print(f"| {shape} | {kernel[:60]} | " + " | ".join(cells) + " |")
        total = sum(m.get("gpu__time_duration.sum", 0.0) for _, m in launches)
        print(f"| {shape} | all: {' '.join(notes) or '-'} | {total:.1f} |" + " |" * (len(COLUMNS) - 1))


if __name__ == "__main__":
    main(sys.argv[1])
