"""Where a kernel's warps wait, by SASS region, from the source page `tools/gpu_host/profile.sh` writes (NAME.sass.csv).

Regions end at each synchronisation point (BAR.SYNC, WARPGROUP.DEPBAR, mbarrier wait, EXIT), so that the table reads
like the kernel's schedule: per region its share of all stall samples, how often it ran (the warp count tells which
warpgroup), its three main stall reasons and main opcodes. Also counts generic (LD.E/ST.E) accesses: in a kernel
that only touches shared memory inside its loop these mean the compiler lost the shared address space.
    usage: python -m tools.kernel_dev.stall_regions NAME.sass.csv [--min-share 1.0]
"""

import argparse
import collections
import csv
import io

SYNC_OPS = ("BAR.SYNC", "WARPGROUP.DEPBAR", "SYNCS.PHASECHK", "EXIT")


def opcode(sass: str) -> str:
    toks = sass.split()
    return toks[1] if toks and toks[0].startswith("@") else (toks[0] if toks else "")


def read_source_page(text: str) -> tuple[list[str], list[list[str]]]:
    """An ncu source page (CSV text): its column names and one row per SASS instruction."""
    rows = list(csv.reader(io.StringIO(text)))
    header = next(i for i, r in enumerate(rows) if "Source" in r)
    return rows[header], rows[header + 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min-share", type=float, default=1.0, help="hide regions under this % of the samples")
    a = ap.parse_args()
    with open(a.csv) as f:
        hdr, data = read_source_page(f.read())
    col = {h: i for i, h in enumerate(hdr)}
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[samples] or 0) for r in data) or 1

    print(f"{'first..last':>11} {'share':>6} {'warp execs':>10}  main stall reasons | main opcodes")
    start = 0
    for k, r in enumerate(data):
        if k + 1 < len(data) and not any(op in r[col["Source"]] for op in SYNC_OPS):
            continue
        region = data[start:k + 1]
        start = k + 1
        share = 100 * sum(int(x[samples] or 0) for x in region) / total
        if share < a.min_share:
            continue
        why, ops = collections.Counter(), collections.Counter()
        for x in region:
            ops[opcode(x[col["Source"]])] += int(x[samples] or 0)
            for i in reasons:
                why[hdr[i][6:]] += int(x[i] or 0)
        runs = max(int(x[executed] or 0) for x in region)
        print(f"{k + 1 - len(region):5d}..{k:<5d} {share:5.1f}% {runs:10d}  "
              + ", ".join(f"{n} {c}" for n, c in why.most_common(3)) + " | "
              + ", ".join(f"{n} {c}" for n, c in ops.most_common(4)))
    generic = sum(1 for r in data if opcode(r[col["Source"]]).startswith(("LD.E", "ST.E")))
    print(f"generic LD.E/ST.E instructions: {generic} (shared-memory accesses should be LDS/STS)")


if __name__ == "__main__":
    main()
