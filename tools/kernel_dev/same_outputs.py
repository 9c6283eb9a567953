"""Whether two copies of the CUDA decode's sources compute the same bits (GPU host, after
`source tools/gpu_host/env.sh`): a schedule change that keeps every product and its summation order must leave the
outputs and LSE bit-identical, which no tolerance-based test shows.

    python3 -m tools.kernel_dev.same_outputs save FILE             # the build of kernels/cuda, or of
    SNAPMLA_CUDA_SOURCE_DIR=ab/NAME/kernels/cuda python3 -m tools.kernel_dev.same_outputs save FILE
    python3 -m tools.kernel_dev.same_outputs compare FILE_A FILE_B  # exit 1 unless every shape is bit-identical

`save` runs the decode on seeded inputs of SHAPES (named as `benchmarks/gpu/time_variants.py` names them; random
lengths up to S_K, the first one full, so partial last pages and several split counts are covered) and stores out and
LSE per shape."""

import argparse
import sys

SHAPES = ("h32x64x4096", "h32x7x1000", "h16x33x5003", "h16x16x4097q2", "h8x5x777", "h32x130x2048", "h128x9x3000")


def save(path: str, shapes=SHAPES) -> None:
    import torch

    from benchmarks.gpu.time_variants import parse_shape
    from harness.kernel_timing import make_inputs

    from sglang_snapmla import ops

    out = {}
    for shape in shapes:
        h, b, sk, s_q, splits = parse_shape(shape)
        torch.manual_seed(1234)
        x = make_inputs(b, sk, h, s_q, 1, "cuda")[0]
        seqlens = torch.randint(1, sk + 1, (b,), device="cuda", dtype=torch.int32)
        seqlens[0] = sk
        o, lse = ops.quantize_and_decode(x["q"][..., :512], x["q"][..., 512:], x["kv8"], x["ks"], x["kr"], x["bt"],
                                         seqlens, 576 ** -0.5, num_splits=splits, impl="cuda")
        out[shape] = {"out": o.cpu(), "lse": lse.cpu()}
    torch.save(out, path)


def _bits(t):
    """The tensor's bytes as integers: NaN payloads and the sign of zero count, as they do for bit identity."""
    import torch

    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def compare(a: dict, b: dict) -> list[str]:
    """One line per shape of `a`: 'bit-identical' or which tensors differ. A shape missing from `b` differs."""
    import torch

    lines = []
    for shape, ta in a.items():
        tb = b.get(shape, {})
        bad = [k for k in ta if k not in tb or ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape
               or not torch.equal(_bits(ta[k]), _bits(tb[k]))]
        lines.append(f"{shape}: " + ("bit-identical" if not bad else "DIFFER in " + ", ".join(bad)))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("save").add_argument("file")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "save":
        save(args.file)
        return 0
    import torch

    lines = compare(torch.load(args.a), torch.load(args.b))
    print("\n".join(lines))
    return 0 if all(line.endswith("bit-identical") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
