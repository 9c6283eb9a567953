"""Compile every Triton kernel for sm_90 ahead of time, without a GPU (run as a script with TRITON_INTERPRET=0).

Catches what the CPU interpreter cannot: code that only fails in Triton's compiler (globals, layouts, fp8 dots).
Prints one line per kernel variant: name, shared memory, PTX size, and the registers and local memory of the cubin
where a cuobjdump is installed.
"""

import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_snapmla import numerics as nx
from sglang_snapmla.kernels.triton import decode, quant

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository's tools package
from tools.kernel_dev.sass_schedule import find_tool  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def resource_usage(cubin: bytes) -> str:
    """' registers R, local L B' of a compiled kernel (cuobjdump --dump-resource-usage, found as the kernel tools find
    it: the CUDA toolkit's or Triton's copy), or '' where there is none."""
    import re
    import subprocess
    import tempfile

    try:
        tool = find_tool("cuobjdump")
    except SystemExit:
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs, local = re.search(r"REG:(\d+)", text), re.search(r"LOCAL:(\d+)", text)
    return f" registers {regs.group(1)}, local {local.group(1)} B" if regs and local else ""


def compile_one(fn, signature, constexprs, **options):
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=TARGET, options=options)


def variants() -> list:
    """(name, kernel, signature, constexprs, compile options) of every Triton kernel variant the package launches."""
    quant_consts = {"FP8_MAX": nx.FP8_MAX, "SCALE_FLOOR": nx.SCALE_FLOOR}
    variants = [
        *((f"quantize_q ROWS={rows} PDL={pdl}", quant.quantize_q_kernel,
           dict(q_nope_ptr="*bf16", q_rope_ptr="*bf16", q8_ptr="*fp8e4nv", q_scale_ptr="*fp32",
                q_rope_out_ptr="*bf16", stride_nt="i32", stride_nh="i32", stride_rt="i32", stride_rh="i32", H="i32"),
           {**quant_consts, "ROWS": rows, "PDL": pdl}, {})
          for rows in (1, 2, 4, 8, 16) for pdl in (False, True) if pdl or rows == 16),
        ("append_kv", quant.append_kv_kernel,
         dict(c_kv_ptr="*bf16", k_rope_ptr="*bf16", loc_ptr="*i64", kv_content_ptr="*fp8e4nv", kv_scale_ptr="*fp32",
              kv_rope_ptr="*bf16", stride_c="i32", stride_r="i32"), quant_consts, {}),
        ("fetch_dequant", quant.fetch_dequant_kernel,
         dict(loc_ptr="*i64", kv_content_ptr="*fp8e4nv", kv_scale_ptr="*fp32", kv_rope_ptr="*bf16",
              c_kv_out_ptr="*bf16", k_rope_out_ptr="*bf16", stride_co="i32", stride_ro="i32"), {}, {}),
    ]
    dec_sig = dict(q8_ptr="*fp8e4nv", q_scale_ptr="*fp32", q_rope_ptr="*bf16", kv_content_ptr="*fp8e4nv",
                   kv_scale_ptr="*fp32", kv_rope_ptr="*bf16", block_table_ptr="*i32", seq_lens_ptr="*i32",
                   o_part_ptr="*fp32", lse_part_ptr="*fp32", out_ptr="*bf16", lse_ptr="*fp32", stride_bt="i32",
                   R="i32", H="i32", S_Q="i32", qk_scale_log2="fp32", NUM_SPLITS="i32", PART_SLOTS="i32")
    for (block_m, warps, stages), final in zip(((16, 4, 3), (32, 4, 2), (64, 8, 2), (16, 4, 3), (32, 4, 2)),
                                               (False, False, False, True, True)):
        variants.append((f"decode_split BLOCK_M={block_m} FINAL={final}", decode.decode_split_kernel, dec_sig,
                         dict(BLOCK_M=block_m, FP8_MAX=nx.FP8_MAX, P_SCALE_FLOOR=nx.P_SCALE_FLOOR, FINAL=final),
                         dict(num_warps=warps, num_stages=stages)))
    for pdl in (False, True):  # PDL: the programmatic dependent launch of decode_plan.pdl_enabled (griddepcontrol.wait)
        variants.append((f"combine PDL={pdl}", decode.combine_kernel,
                         dict(o_part_ptr="*fp32", lse_part_ptr="*fp32", out_ptr="*bf16", lse_ptr="*fp32", R="i32",
                              H="i32", S_Q="i32", NUM_SPLITS="i32", PART_SLOTS="i32"),
                         {"SPLITS_P2": 64, "SPLIT_CHUNK": 16, "PDL": pdl},
                         dict(launch_pdl=pdl)))
    return variants


def main() -> int:
    for name, fn, sig, consts, opts in variants():
        k = compile_one(fn, sig, consts, **opts)
        if consts.get("PDL") and "griddepcontrol" not in k.asm["ptx"]:
            raise AssertionError(f"{name}: no griddepcontrol instruction in the PTX")
        print(f"{name}: ok (shared {k.metadata.shared} B, ptx {len(k.asm['ptx'])} chars){resource_usage(k.asm['cubin'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
