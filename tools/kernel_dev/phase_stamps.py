"""A copy of the sm_90a decode whose 64-row kernel records, per CTA, when it reaches each phase of its life: the
per-phase timing of docs/KERNEL.md ("What limits it", 128 heads at short contexts), which ncu's totals and stall
samples do not separate. Measured on a GPU by `benchmarks/gpu/cta_phases.py`, which writes the copy itself.

    python -m tools.kernel_dev.phase_stamps [--source-dir kernels/cuda] [--out ab]   -> OUT/stamps/kernels/cuda

At each point one thread of the CTA stores %globaltimer (ns, one clock for every SM: places CTAs and waves on a common
axis) and clock64 (the SM's cycles: durations inside a CTA at full resolution) into a device array, and the CTA's
first point also its SM (%smid); the torch binding of the copy gains `phase_stamps()` (an int64 [CTAs, 2 x POINTS
+ 1] CPU tensor, CTA index blockIdx.x + gridDim.x (blockIdx.y + gridDim.y blockIdx.z); never reached: 0) and
`clear_phase_stamps()`. Each point costs one thread two special-register reads and three stores, off the page loop.

As in tools/kernel_dev/ablations.py, every edit replaces source text that must occur exactly once in the 64-row
kernel (or in the file, for the helpers): a kernel that has changed stops the tool naming the point, so the copy never
silently records less than it says.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_snapmla.cuda_ext import SOURCE_DIR
from tools.kernel_dev.ablations import copy_sources

KERNEL, BINDING = "snapmla_decode_sm90.cu", "binding.cpp"
NAME = "stamps"
MAX_CTAS = 8192  # the device array's CTAs (h128 b256 at 16 splits: 8 192); CTAs past it record nothing

# (name, what the CTA has done when the point is stamped, thread, kernel text the stamp follows)
POINTS = [
    ("start", "entered the kernel", "t == 0",
     "  uint64_t* qfull = pempty + 2;                                // Q landed (TMA) or quantized here\n"),
    ("barriers", "initialised its mbarriers (a block barrier)", "t == 0",
     "  __syncthreads();  // the barriers are initialised before any thread uses them\n"),
    ("released", "passed griddepcontrol.wait (the Q-quant has completed)", "t == 0",
     '  asm volatile("griddepcontrol.wait;\\n" ::: "memory");\n'),
    ("q", "Q has landed in shared memory (softmax warpgroup)", "t == 0", "    mbar_wait(qfull, 0);\n"),
    ("page0", "the split's first page has landed", "t == 0", "      mbar_wait(full, 0);\n"),
    ("qk0", "the first page's QK is done", "t == 0",
     "      for (int j = 0; j < 32; ++j) cur[j] += nxt2[j];\n"),
    ("softmax", "the softmax of the last page is published", "t == 0",
     "      softmax_page(cur, last - 1, [] {});\n"),
    ("pv", "PV of the last page is done (first PV warpgroup)", "t == 128",
     "      mbar_arrive(pempty + pb);\n    }\n"),
    ("end", "its output is stored (the bf16 tile's TMA store has read shared memory, or the partials are issued)",
     "t == 128", "#endif\n"),
]
WORDS = 2 * len(POINTS) + 1  # globaltimer per point, clock64 per point, the SM

DEVICE_HELPERS = f"""
// ---- phase stamps (tools/kernel_dev/phase_stamps.py):
//      [CTA][globaltimer x {len(POINTS)}, clock64 x {len(POINTS)}, smid]
__device__ unsigned long long snapmla_phase_stamps[{MAX_CTAS} * {WORDS}];
__device__ __forceinline__ void phase_stamp(int point) {{
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  const unsigned long long clk = clock64();
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= {MAX_CTAS}) return;
  unsigned long long* s = snapmla_phase_stamps + (unsigned long long)cta * {WORDS};
  s[point] = gt;
  s[{len(POINTS)} + point] = clk;
  if (point == 0) {{
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    s[{2 * len(POINTS)}] = smid;
  }}
}}
"""
HOST_HELPERS = f"""
extern "C" int snapmla_phase_stamps_read(void* dst) {{
  return (int)cudaMemcpyFromSymbol(dst, snapmla::snapmla_phase_stamps, sizeof(snapmla::snapmla_phase_stamps));
}}
extern "C" int snapmla_phase_stamps_clear() {{
  void* p = nullptr;
  cudaError_t e = cudaGetSymbolAddress(&p, snapmla::snapmla_phase_stamps);
  return (int)(e == cudaSuccess ? cudaMemset(p, 0, sizeof(snapmla::snapmla_phase_stamps)) : e);
}}
"""
BINDING_DECLS = f"""extern "C" int snapmla_phase_stamps_read(void* dst);
extern "C" int snapmla_phase_stamps_clear();
torch::Tensor phase_stamps() {{
  auto t = torch::empty({{{MAX_CTAS}, {WORDS}}}, torch::kInt64);
  TORCH_CHECK(snapmla_phase_stamps_read(t.data_ptr()) == 0, "phase stamps: cudaMemcpyFromSymbol failed");
  return t;
}}
void clear_phase_stamps() {{ TORCH_CHECK(snapmla_phase_stamps_clear() == 0, "phase stamps: clear failed"); }}

"""
BINDING_DEFS = """  m.def("phase_stamps", &phase_stamps, "per-CTA phase stamps (tools/kernel_dev/phase_stamps.py)");
  m.def("clear_phase_stamps", &clear_phase_stamps);
"""
WIDE_BEGIN = "decode_split_sm90_kernel(\n    const __grid_constant__"
WIDE_END = "// ---- The narrow decode"


def _once(text: str, anchor: str, what: str, where: str) -> int:
    n = text.count(anchor)
    if n != 1:
        raise SystemExit(f"phase stamps: the text of {what!r} occurs {n} times in {where} (expected once); update "
                         f"tools/kernel_dev/phase_stamps.py to the kernel")
    return text.index(anchor)


def stamp_kernel(source: str) -> str:
    """The kernel source with a stamp after each of POINTS in the 64-row kernel, and the device array and its
    host readers."""
    begin = _once(source, WIDE_BEGIN, "the 64-row kernel's signature", KERNEL)
    end = _once(source, WIDE_END, "the narrow kernel's header", KERNEL)
    wide = source[begin:end]
    for i, (name, _, thread, anchor) in enumerate(POINTS):
        at = _once(wide, anchor, name, "the 64-row kernel")
        if anchor == "#endif\n":  # the kernel body's last line: the stamp goes before it, at the body's indent
            indent = "  "
        else:  # after the anchor, at the indent of its last line
            at += len(anchor)
            last_line = anchor.rstrip("\n").split("\n")[-1]
            indent = last_line[: len(last_line) - len(last_line.lstrip(" "))]
        wide = wide[:at] + f"{indent}if ({thread}) phase_stamp({i});  // phase stamp: {name}\n" + wide[at:]
    source = source[:begin] + wide + source[end:]
    ns = _once(source, "namespace snapmla {\n", "the namespace opening", KERNEL) + len("namespace snapmla {\n")
    source = source[:ns] + DEVICE_HELPERS + source[ns:]
    closing = "}  // namespace snapmla\n"
    tail = _once(source, closing, "the namespace closing", KERNEL) + len(closing)
    return source[:tail] + HOST_HELPERS + source[tail:]


def stamp_binding(source: str) -> str:
    """binding.cpp with phase_stamps() and clear_phase_stamps()."""
    module = _once(source, "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n", "the module definition", BINDING)
    body = module + len("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n")
    return source[:module] + BINDING_DECLS + source[module:body] + BINDING_DEFS + source[body:]


def write(source_dir: Path, out: Path) -> Path:
    """OUT/stamps/kernels/cuda: source_dir's sources with the stamped kernel and binding."""
    dest = copy_sources(source_dir, out, NAME)
    (dest / KERNEL).write_text(stamp_kernel((source_dir / KERNEL).read_text()))
    (dest / BINDING).write_text(stamp_binding((source_dir / BINDING).read_text()))
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", type=Path, default=Path(SOURCE_DIR))
    ap.add_argument("--out", type=Path, default=Path("ab"))
    args = ap.parse_args(argv)
    print(write(args.source_dir, args.out))


if __name__ == "__main__":
    main()
