"""The result files of the benchmarks and tools: a matrix run's JSON ({model: {backend: {"workloads": {...}, ...}}}),
resumed or merged from several runs, and the reading of any saved JSON, plain or as results/ keeps its large ones
(NAME.json.xz), the excerpt of a server log that results/serve keeps, and the plots as results/ keeps them.

    python -m harness.results excerpt server_snapmla.log results/serve/RUN/server_snapmla.log.xz
    python -m harness.results png results/serve/RUN/serve_bench.png      (a PNG written otherwise, stored as save_png's)
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
from pathlib import Path

from harness.server_log import read_log


def stored(path: Path) -> Path:
    """`path`, or its xz-compressed copy NAME.json.xz where only that exists (results/ keeps JSON over 8 KB so)."""
    xz = path.with_name(path.name + ".xz")
    return xz if not path.exists() and xz.exists() else path


def read_json(path: Path):
    """The JSON at `path` (`stored`: plain or .xz; a path ending in .xz is read through lzma)."""
    path = stored(Path(path))
    with (lzma.open(path, "rt") if path.suffix == ".xz" else open(path)) as f:
        return json.load(f)


def merge_into(results: dict, other: dict) -> dict:
    """Adds `other`'s runs to `results` in place: a (model, backend) measured in several calls keeps the workloads
    of all of them (a later call's run of the same workload replaces the earlier one)."""
    for model, backends in other.items():
        for backend, run in backends.items():
            mine = results.setdefault(model, {}).setdefault(backend, {})
            workloads = {**mine.get("workloads", {}), **run.get("workloads", {})}
            mine.update(run)
            mine["workloads"] = workloads
    return results


def load_results(saved: Path, merge: list[Path] | None, resume: bool) -> dict:
    """The results a matrix run starts from: the merged files of `merge`, or with `resume` those already `saved`."""
    results: dict = {}
    for f in merge or []:
        merge_into(results, read_json(f))
    if not merge and resume and stored(saved).exists():
        results = read_json(saved)
    return results


PNG_COLOURS = 256


def _palette(image, path: Path) -> None:
    """`image` (PIL) written to `path` as a PNG with a palette of at most PNG_COLOURS colours."""
    from PIL import Image

    image.convert("RGB").quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT).save(path, "PNG", optimize=True)


def palette_png(path: Path) -> None:
    """Rewrite the PNG at `path` with a palette of at most PNG_COLOURS colours: a plot's lines, text and
    anti-aliasing fit in it (mean pixel change below one level of 255), and the file takes 0.37-1.0x the bytes of
    matplotlib's RGBA one (0.91x over the plots in results/), which keeps results/ in its budget
    (results/README.md)."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    _palette(rgb, path)


def save_png(fig, path: Path, dpi: int) -> Path:
    """A matplotlib figure as results/ keeps its plots: rendered at `dpi` in memory, written once as `palette_png`
    stores a PNG."""
    import io

    from PIL import Image

    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi)
    rendered.seek(0)
    with Image.open(rendered) as im:
        _palette(im, Path(path))
    return Path(path)


# what the benchmarks read back from a kept server log (harness.server_log: batches, pool size, peak batch, the
# engine's rate) and what the docs quote from one (graph capture, start-up, the plugin's own messages)
EXCERPT_KEEP = re.compile(r"(Prefill|Decode) batch|max_total_num_tokens|CUDA graph|Engine startup|Load weight|snapmla:"
                          r"|snapmla dummy weights|SnapMLA decode:|fired up and ready|Try DeepGEMM JIT Compiling")
SERVER_ARGS_CHARS = 600


def traceback_lines(lines: list[str]) -> set[int]:
    """Indices of every traceback's lines: from its "Traceback (most recent call last)" line through the exception
    line that ends it (the first line after it that is not indented) -- why a server died, kept whole."""
    kept, inside = set(), False
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            kept.add(i)
            inside = True
        elif inside:
            kept.add(i)
            inside = line[:1].isspace() or not line.strip()
    return kept


def server_log_excerpt(text: str) -> str:
    """A server log as results/serve keeps it: its first server-args line cut to SERVER_ARGS_CHARS, then every line
    EXCERPT_KEEP matches and every traceback, in order, under a first line that says what was kept and how many lines
    were left out."""
    lines = text.splitlines()
    args = next((ln for ln in lines if "server_args=ServerArgs(" in ln), None)
    failures = traceback_lines(lines)
    # (no pattern occurs in the server-args line)
    kept = [ln for i, ln in enumerate(lines) if i in failures or EXCERPT_KEEP.search(ln)]
    left_out = len(lines) - len(kept) - (args is not None)
    head = (f"# excerpt of the server log: its server args line cut to {SERVER_ARGS_CHARS} characters and the "
            f"{len(kept)} lines with batches, the pool size, graph capture, start-up and tracebacks ({left_out} "
            f"others left out)")
    return "\n".join([head, *([args[:SERVER_ARGS_CHARS]] if args is not None else []), *kept]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="Keep a server log under results/serve as an xz-compressed excerpt.")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("excerpt", help="SRC (a server log, plain or .xz) -> DST (.xz): `server_log_excerpt`")
    ex.add_argument("src", type=Path)
    ex.add_argument("dst", type=Path)
    png = sub.add_parser("png", help="PNG files rewritten in place as `save_png` stores plots (`palette_png`)")
    png.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args()
    if args.command == "png":
        for path in args.paths:
            palette_png(path)
        return
    if args.dst.suffix != ".xz":
        ap.error(f"{args.dst}: the excerpt is written xz-compressed; name it {args.dst.name}.xz")
    with lzma.open(args.dst, "wt", preset=9 | lzma.PRESET_EXTREME) as f:  # results/ has a size cap
        f.write(server_log_excerpt(read_log(args.src)))


if __name__ == "__main__":
    main()
