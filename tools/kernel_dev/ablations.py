"""Copies of the sm_90a decode with one part of its page loop compiled out, to time what each part costs
(docs/KERNEL.md, "What limits it"). Their outputs are wrong by construction: they are timed, never tested.

    python -m tools.kernel_dev.ablations [--source-dir kernels/cuda] [--out ab] NAME...

NAME is one ablation or several joined by "_" (e.g. nopv_notr); each becomes OUT/NAME/kernels/cuda, the layout that
benchmarks/gpu/time_variants.py and tools/gpu_host/ab.sh read:

    nosfu  the softmax's SFU operations (EX2, LG2, RCP) replaced by one FMA each
    notr   no V transpose (the PV warpgroups read whatever V^T holds)
    nopv   no PV WGMMAs (the O rescale, the P8 hand-off and the transpose stay)
    noqk   no QK WGMMAs (the softmax runs on whatever the accumulators hold)

Each ablation edits the 64-row kernel (the one docs/KERNEL.md's ablation table measures) and replaces source text
that must occur exactly once in the file: a kernel that no longer has it stops the tool with the ablation's name, so
an ablation never silently times the unchanged kernel.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from sglang_snapmla.cuda_ext import SOURCE_DIR

KERNEL = "snapmla_decode_sm90.cu"

_SFU = [(f'asm("{op}.approx.ftz.f32 %0, %1;\\n" : "=f"(y) : "f"(x));', "y = fmaf(x, 0.5f, 1.0f);  // ablation")
        for op in ("ex2", "lg2", "rcp")]

# name -> [(text of the kernel, its replacement)]
ABLATIONS = {
    "nosfu": _SFU,
    "notr": [("""      if (valid == kPage) transpose_half<false>(stage_of(c), vt, half, tw, valid);
      else transpose_half<true>(stage_of(c), vt, half, tw, valid);""", "      // ablation: no V transpose")],
    "nopv": [("""        wgmma_m64n256k32_e4m3(o, smem_desc(smem + kP8 + pb * kP8Bytes + k * 256, (kPage / 16) * 128),
                              smem_desc(vt + k * 256, kVTStride), 1);""", "        ;  // ablation: no PV WGMMA")],
    "noqk": [("""        wgmma_m64n64k32_e4m3_rs(s, q_frag[k], desc_k + (((k / 4) * kTile + (k % 4) * 32) >> 4),
                                k != 0 && k != kQkFirst);""", "        ;  // ablation: no QK content WGMMA"),
             ("""          wgmma_m64n64k16_bf16_rs(s, qr_frag[k], desc_k + ((4 * kTile + k * 32) >> 4), 1);""",
              "          ;  // ablation: no QK RoPE WGMMA")],
}


def ablate(source: str, name: str) -> str:
    """The kernel source with the parts of `name` ("nopv", or several joined by "_") compiled out."""
    for part in name.split("_"):
        if part not in ABLATIONS:
            raise SystemExit(f"unknown ablation {part!r}; known: {', '.join(ABLATIONS)}")
        for text, replacement in ABLATIONS[part]:
            if source.count(text) != 1:
                raise SystemExit(f"ablation {part!r}: its source text occurs {source.count(text)} times in {KERNEL} "
                                 f"(expected once); update tools/kernel_dev/ablations.py to the kernel")
            source = source.replace(text, replacement)
    return source


def copy_sources(source_dir: Path, out: Path, name: str) -> Path:
    """OUT/NAME/kernels/cuda (the layout benchmarks/gpu/time_variants.py reads), emptied, with source_dir's files (not
    its built prebuilt/ library, which would be today's kernel under the copy's name)."""
    dest = out / name / "kernels" / "cuda"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for source in source_dir.iterdir():
        if source.is_file():
            shutil.copy2(source, dest / source.name)
    return dest


def write(source_dir: Path, out: Path, name: str) -> Path:
    """OUT/NAME/kernels/cuda: a copy of source_dir's sources with the ablated kernel."""
    dest = copy_sources(source_dir, out, name)
    (dest / KERNEL).write_text(ablate((source_dir / KERNEL).read_text(), name))
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--source-dir", type=Path, default=Path(SOURCE_DIR))
    ap.add_argument("--out", type=Path, default=Path("ab"))
    args = ap.parse_args(argv)
    for name in args.names:
        print(write(args.source_dir, args.out, name), file=sys.stdout)


if __name__ == "__main__":
    main()
