"""Where ptxas puts the sm_90a decode's tensor-core work among the softmax's SFU work, read from the compiled SASS on
a machine without a GPU (nvcc, and cuobjdump from the CUDA toolkit or the copy Triton ships).

    python -m tools.kernel_dev.sass_schedule [--source-dir kernels/cuda] [-D NAME=VALUE ...] [--cubin FILE]

The softmax warpgroup issues QK of page c+1 in two parts (docs/KERNEL.md, "What is in the schedule, and why"): part 1 before page c's
softmax, part 2 meant to go between its two passes (pass 1: 16 LG2 per thread for log2 sigma_k and the row max;
pass 2: the row-max shuffles, 32 EX2 and 16 RCP). Source order does not bind ptxas, so this prints, per kernel
function, the address-ordered run-length sequence of the instructions that tell the schedule (QGMMA / HGMMA,
MUFU.EX2 / LG2 / RCP, SHFL.BFLY, WARPGROUP.DEPBAR, SYNCS.PHASECHK), and for every tensor group (a run of WGMMAs) the
SFU and shuffle work placed since the previous group. A part 2 that sits between the passes follows the LG2s with
no EX2; one that follows ~32 EX2 and the shuffles is issued after pass 2, and the wait at the end of the page then
covers its tensor time. A static reading: what it costs is measured on the GPU (ncu, tools/gpu_host/profile.sh).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_snapmla.cuda_ext import NVCC_FLAGS, SOURCE_DIR

KINDS = ("QGMMA", "HGMMA", "MUFU.EX2", "MUFU.LG2", "MUFU.RCP", "SHFL.BFLY", "WARPGROUP.DEPBAR", "SYNCS.PHASECHK")
TENSOR = ("QGMMA", "HGMMA")
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_FUNCTION = re.compile(r"Function : (\S+)")


def sequence(sass: str) -> dict[str, list[list]]:
    """cuobjdump -sass text -> {function: [[kind, count], ...]}: the KINDS instructions in address order, runs of one
    kind merged."""
    out: dict[str, list[list]] = {}
    runs = None
    for line in sass.splitlines():
        fn = _FUNCTION.search(line)
        if fn:
            runs = out.setdefault(fn.group(1), [])
            continue
        m = _INSTR.search(line)
        if m is None or runs is None:
            continue
        kind = next((k for k in KINDS if m.group(2).startswith(k)), None)
        if kind is None:
            continue
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    return out


def tensor_groups(runs: list[list]) -> list[dict]:
    """Every group of WGMMAs -> {"qgmma", "hgmma", and the SFU and shuffle instructions placed since the previous
    group: "lg2", "shfl", "ex2", "rcp"}. A group is a stretch of QGMMA / HGMMA runs; up to two other instructions
    that ptxas slots between two of its runs stay inside it (not counted)."""
    names = {"MUFU.LG2": "lg2", "SHFL.BFLY": "shfl", "MUFU.EX2": "ex2", "MUFU.RCP": "rcp"}
    groups, since, current = [], dict.fromkeys(names.values(), 0), None
    for i, (kind, n) in enumerate(runs):
        if kind in TENSOR:
            if current is None:
                current, since = {"qgmma": 0, "hgmma": 0, **since}, dict.fromkeys(since, 0)
            current[kind.lower()] += n
            continue
        if current is not None and n <= 2 and i + 1 < len(runs) and runs[i + 1][0] in TENSOR:
            continue  # slotted inside the group
        if current is not None:
            groups.append(current)
            current = None
        if kind in names:
            since[names[kind]] += n
    if current is not None:
        groups.append(current)
    return groups


def find_tool(name: str) -> str:
    """The CUDA toolkit's `name` on PATH or under /usr/local/cuda, else Triton's bundled copy."""
    found = shutil.which(name) or next((str(p) for p in [Path("/usr/local/cuda/bin") / name] if p.exists()), None)
    if found:
        return found
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise SystemExit(f"{name} not found: install the CUDA toolkit (or Triton, which ships cuobjdump)")


def build_cubin(source_dir: Path, out: Path, defines: list[str] = ()) -> tuple[Path, str]:
    """The decode compiled for sm_90a with the extension's flags (no torch headers needed) -> (cubin, ptxas's
    register and spill lines)."""
    cubin = out / "snapmla_decode_sm90.cubin"
    res = subprocess.run([find_tool("nvcc"), *NVCC_FLAGS, "-cubin", *(f"-D{d}" for d in defines), "-o", str(cubin),
                          str(source_dir / "snapmla_decode_sm90.cu")], capture_output=True, text=True, timeout=900)
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    return cubin, "\n".join(ln.strip() for ln in res.stderr.splitlines() if "Used" in ln or "spill" in ln)


def disassemble(cubin: Path) -> str:
    res = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, timeout=300)
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    return res.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", type=Path, default=SOURCE_DIR)
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="a macro for the build, e.g. SNAPMLA_SOFTMAX_REGS=200")
    ap.add_argument("--cubin", type=Path, help="an already built cubin (default: build one from --source-dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = args.cubin
        if cubin is None:
            cubin, registers = build_cubin(args.source_dir, Path(tmp), args.defines)
            print(registers)
        functions = sequence(disassemble(cubin))
    for name, runs in functions.items():
        print(f"{name}\n  " + " ".join(f"{k}x{n}" for k, n in runs))
        print("  | tensor group | QGMMA | HGMMA | LG2 before | SHFL before | EX2 before | RCP before |")
        print("  |---:|---:|---:|---:|---:|---:|---:|")
        for i, g in enumerate(tensor_groups(runs)):
            print(f"  | {i} | {g['qgmma']} | {g['hgmma']} | {g['lg2']} | {g['shfl']} | {g['ex2']} | {g['rcp']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
