"""Mutation testing of the sm_90a decode (kernels/cuda): each mutant is one bug put into a copy of the sources, and the
GPU suite must fail on it. `tools/gpu_host/cuda_mutants.sh` builds every mutant (SNAPMLA_CUDA_SOURCE_DIR, its own
extension) and runs the CUDA-decode tests against each; here, on any machine, the mutants are written and checked.

    python -m tools.kernel_dev.cuda_mutants check [--compile]   every edit applies to its exact count of places (and,
                                                                with --compile, each mutant compiles with nvcc)
    python -m tools.kernel_dev.cuda_mutants write DIR [NAME...] DIR/NAME: a copy of kernels/cuda with NAME's edits
    python -m tools.kernel_dev.cuda_mutants summarize TSV OUT   the GPU run's outcomes -> table (stdout) and OUT.json

The bugs are the kind a kernel change makes without failing to compile: an index layout, a causal bound, a mask,
a guard on an empty split or a keyless row, a scale left out. Mutants that would only hang (a barrier parity) or
only read out of bounds (compute-sanitizer's job, tools/gpu_host/correctness.sh) are not here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_snapmla.cuda_sources import CODEGEN_FLAGS, SOURCE_DIR

KERNEL = "snapmla_decode_sm90.cu"


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the bug, as a reader of the kernel would say it
    edits: tuple[tuple[str, str, int], ...]  # (text, replacement, the count of places the text is at)
    file: str = KERNEL


def _m(name: str, what: str, *edits: tuple[str, str, int], file: str = KERNEL) -> Mutant:
    return Mutant(name, what, tuple(edits), file)


MUTANTS = (
    _m("wide_causal_off_by_one", "64-row kernel: a query row's own key (the newest it sees) masked",
       ("t0 = (key <= last_key0 && grow0 < R)", "t0 = (key < last_key0 && grow0 < R)", 1),
       ("t1 = (key <= last_key1 && grow1 < R)", "t1 = (key < last_key1 && grow1 < R)", 1)),
    _m("wide_window_key_by_head", "64-row kernel: a draft-window row's last key from its head, not its token",
       ("last_key0 = seq_len - S_Q + grow0 / H, last_key1 = seq_len - S_Q + grow1 / H",
        "last_key0 = seq_len - S_Q + grow0 % H, last_key1 = seq_len - S_Q + grow1 % H", 1)),
    _m("wide_unmasked_past_window", "64-row kernel: pages holding draft keys taken as unmasked (no causal select)",
       ("mask)\n    const int unmasked_end = (seq_len - S_Q + 1) / kPage;",
        "mask)\n    const int unmasked_end = (seq_len + 1) / kPage;", 1)),
    _m("narrow_unmasked_past_window", "narrow kernel: pages holding draft keys taken as unmasked",
       ("own_run = -INFINITY;\n    const int unmasked_end = (seq_len - S_Q + 1) / kPage;",
        "own_run = -INFINITY;\n    const int unmasked_end = (seq_len + 1) / kPage;", 1)),
    _m("narrow_window_key_by_head", "narrow kernel: a draft-window row's last key from its head, not its token",
       ("last_key[i] = seq_len - S_Q + n / H;", "last_key[i] = seq_len - S_Q + n % H;", 1)),
    _m("wide_lse_layout", "64-row kernel, one split: LSE stored [B, s_q, H] instead of [B, H, s_q]",
       ("lse_out[((int64_t)b * H + grow % H) * S_Q + grow / H]",
        "lse_out[((int64_t)b * S_Q + grow / H) * H + grow % H]", 1)),
    _m("narrow_lse_layout", "narrow kernel, one split: LSE stored [B, s_q, H] instead of [B, H, s_q]",
       ("lse_out[((int64_t)b * H + t % H) * S_Q + t / H]", "lse_out[((int64_t)b * S_Q + t / H) * H + t % H]", 1)),
    _m("wide_lse_base2", "64-row kernel, one split: LSE left in base 2", ("lse2 * 0.6931471805599453f", "lse2", 1)),
    _m("wide_lse_without_fp8_units", "64-row kernel: LSE without the P8 units' log2 448 (outputs unchanged)",
       ("ref0 + log2f(l0) - kLog2Fp8Max", "ref0 + log2f(l0)", 1),
       ("ref1 + log2f(l1) - kLog2Fp8Max", "ref1 + log2f(l1)", 1)),
    _m("wide_keyless_row_scale", "64-row kernel: a row that sees no key scaled by 1 / 0",
       ("rows_s[row0] = l0 != 0.f ? 1.f / l0 : 0.f;", "rows_s[row0] = 1.f / l0;", 1),
       ("rows_s[row1] = l1 != 0.f ? 1.f / l1 : 0.f;", "rows_s[row1] = 1.f / l1;", 1)),
    _m("narrow_keyless_row_scale", "narrow kernel: a row that sees no key scaled by 1 / 0",
       ("const float inv = lsum != 0.f ? 1.f / lsum : 0.f;", "const float inv = 1.f / lsum;", 1)),
    _m("wide_empty_split_lse", "64-row kernel: a split without pages leaves its LSE slot unwritten",
       ("      lse_part[((int64_t)b * R + tile * kRows + t) * part_slots + split] = -INFINITY;", "      ;", 1)),
    _m("narrow_empty_split_lse", "narrow kernel: a split without pages leaves its LSE slot unwritten",
       ("if (t < R) lse_part[((int64_t)b * R + t) * part_slots + split] = -INFINITY;", "if (t < R) {}", 1)),
    _m("wide_partials_unpadded", "64-row kernel: split partials `splits` slots apart instead of the buffer's slots",
       ("* part_slots + split) * kLatent + col;", "* num_splits + split) * kLatent + col;", 2),
       ("lse_part[((int64_t)b * R + grow) * part_slots + split] = lse2;",
        "lse_part[((int64_t)b * R + grow) * num_splits + split] = lse2;", 1)),
    _m("narrow_partials_unpadded", "narrow kernel: split partials `splits` slots apart instead of the buffer's slots",
       ("* part_slots + split) * kLatent + ch]", "* num_splits + split) * kLatent + ch]", 1),
       ("* part_slots + split] = rows_l[t];", "* num_splits + split] = rows_l[t];", 1)),
    _m("wide_tail_v_unmasked", "64-row kernel: the last page's V past the sequence end not zeroed (stale bytes x P8 0)",
       ("if (valid == kPage) transpose_half<false>(stage_of(c), vt, half, tw, valid);",
        "if (true) transpose_half<false>(stage_of(c), vt, half, tw, valid);", 1)),
    _m("narrow_tail_v_unmasked", "narrow kernel: the last page's V past the sequence end not zeroed",
       ("if (valid < kPage) transpose_half_fragments<true>(stage_of(c), half, tw, valid, a);",
        "if (false) transpose_half_fragments<true>(stage_of(c), half, tw, valid, a);", 1)),
    _m("page_reference_without_gap", "both kernels: a page far weaker than the row's running max becomes the reference",
       ("return fmaxf(fmaxf(page_max, running_max - kRefGap), kNoRef);", "return fmaxf(page_max, kNoRef);", 1)),
    _m("wide_denominator_without_v_scale", "64-row kernel: the softmax denominator sums P8 without 1 / sigma_k",
       ("sp0[r] = fmaf(p0, inv_k, sp0[r]);", "sp0[r] += p0;", 1),
       ("sp1[r] = fmaf(p1, inv_k, sp1[r]);", "sp1[r] += p1;", 1)),
    _m("narrow_denominator_without_v_scale", "narrow kernel: the softmax denominator sums P8 without 1 / sigma_k",
       ("sp = fmaf(p, inv_k[h], sp);", "sp += p;", 1)),
    _m("binding_bt_entries_unchecked", "binding: a block-table bound past the table's storage accepted",
       ("TORCH_CHECK(bt_entries >= 0 && bt_entries <=", "TORCH_CHECK(true || bt_entries <=", 1),
       file="binding.cpp"),
)
BY_NAME = {m.name: m for m in MUTANTS}


def mutate(text: str, mutant: Mutant) -> str:
    """`text` with `mutant`'s edits; each text must be at exactly its count of places, so that a kernel change that
    moves or repeats it fails here instead of testing nothing."""
    for old, new, count in mutant.edits:
        found = text.count(old)
        if found != count:
            raise ValueError(f"{mutant.name}: {old!r} is at {found} places in {mutant.file}, expected {count}")
        text = text.replace(old, new)
    return text


def write(directory: Path, names: list[str] | None = None, source: Path = SOURCE_DIR) -> list[Path]:
    """directory/NAME for each mutant: a copy of `source` (kernels/cuda) with its edits."""
    out = []
    for name in names or list(BY_NAME):
        mutant = BY_NAME[name]
        target = directory / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
        path = target / mutant.file
        path.write_text(mutate(path.read_text(), mutant))
        out.append(target)
    return out


def compile_check(directory: Path) -> str | None:
    """nvcc's error for `directory`'s kernel file (compile only, the library's code generation), None when it builds."""
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["nvcc", *CODEGEN_FLAGS, "-c", str(directory / KERNEL), "-o", f"{tmp}/k.o"],
                           capture_output=True, text=True)
    return None if r.returncode == 0 else r.stderr[-2000:]


def read_outcomes(tsv: Path) -> dict[str, tuple[str, str]]:
    """A GPU run's outcomes.tsv (tools/gpu_host/cuda_mutants.sh), in its order: {mutant: (outcome, detail)}, the
    detail being the first failing test or pytest's last line, with the seconds the tests took."""
    return {name: (outcome, detail) for name, outcome, detail in
            ((line.split("\t") + ["", ""])[:3] for line in tsv.read_text().splitlines())}


def summarize(tsv: Path, out: Path) -> list[dict]:
    """The GPU run's outcomes -> rows, printed as a table and saved as out.json. Outcomes: caught (a test failed),
    survived (every selected test passed), build failed, timed out, not run."""
    rows = [{"mutant": name, "what": BY_NAME[name].what if name in BY_NAME else "", "outcome": outcome,
             "detail": detail} for name, (outcome, detail) in read_outcomes(tsv).items()]
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("| mutant | the bug | outcome | first failing test |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['mutant']} | {r['what']} | {r['outcome']} | {r['detail']} |")
    counts = {o: sum(r["outcome"] == o for r in rows) for o in sorted({r["outcome"] for r in rows})}
    print(", ".join(f"{n} {o}" for o, n in counts.items()))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--compile", action="store_true", help="also compile each mutant's kernel file with nvcc")
    w = sub.add_parser("write")
    w.add_argument("directory", type=Path)
    w.add_argument("names", nargs="*", choices=[[], *BY_NAME], metavar="NAME")
    s = sub.add_parser("summarize")
    s.add_argument("tsv", type=Path)
    s.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        for path in write(args.directory, args.names or None):
            print(path)
    elif args.cmd == "summarize":
        summarize(args.tsv, args.out)
    else:
        failed = 0
        with tempfile.TemporaryDirectory() as tmp:
            for path in write(Path(tmp)):
                error = compile_check(path) if args.compile else None
                print(f"{path.name}: {'does not compile: ' + error if error else 'ok'}")
                failed += error is not None
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
