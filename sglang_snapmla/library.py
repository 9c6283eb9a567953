"""The ops SGLang's model calls, as typed torch ops (`torch.ops.snapmla.*`) for torch.compile.

Under torch.compile (SGLang's `--enable-torch-compile`) Dynamo traces the model's forward, our backend included. A
plain call into `ops` would be traced into its launch code: Triton launches, the sm_90a library's pybind call and
the host-side checks, none of which Dynamo can keep in one graph. Registered as custom ops with fake
implementations (output shapes and dtypes from the input shapes alone), each is one opaque node of known signature:

| op | schema (what `ops` documents in full) |
|---|---|
| snapmla::quantize_q | (q_nope [T, H, 512], q_rope [T, H, 64]) -> (q8 [T, H, 512] fp8, q_scale [T, H] fp32, q_rope' [T, H, 64]) |
| snapmla::decode | (q8 [B, s_q, H, 512], q_scale [B, s_q, H], q_rope' [B, s_q, H, 64], kv_content, kv_scale, kv_rope, block_table [B, P] int32, seq_lens [B] int32, softmax_scale, the plan's impl / splits / slots / pdl / tiling, follows_q_quant) -> (out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32) |
| snapmla::quantize_and_decode | (q_nope [B * s_q, H, 512], q_rope [B * s_q, H, 64] bf16, kv_content, kv_scale, kv_rope, block_table, seq_lens, softmax_scale, s_q, the plan's impl / splits / slots / pdl / tiling / q_in_decode) -> (out [B, s_q, H, 512] bf16, lse [B, H, s_q] fp32) |
| snapmla::append_kv | (c_kv [T, 512], k_rope [T, 64], loc [T], kv_content!, kv_scale!, kv_rope!) -> () |
| snapmla::fetch_dequant | (loc [N], kv_content, kv_scale, kv_rope) -> (c_kv [N, 512], k_rope [N, 64] bf16) |

The functions below are what the backend and the pool call: inside a torch.compile trace they call the typed op,
otherwise `ops` directly, because the dispatcher costs every call of a custom op tens of microseconds of host time
(45 us on the CI machine's CPU) that eager prefill would pay per layer; under CUDA graphs neither path runs on the
host at replay. Both reach the same kernels with the same arguments.
"""

from __future__ import annotations

import torch

from . import decode_plan, ops
from .layout import FP8_DTYPE, KV_LORA_RANK, ROPE_DIM

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------------------
# the typed ops
# ----------------------------------------------------------------------------------------------------------
@torch.library.custom_op("snapmla::quantize_q", mutates_args=())
def _quantize_q(q_nope: Tensor, q_rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return ops.quantize_q(q_nope, q_rope)


@_quantize_q.register_fake
def _(q_nope, q_rope):
    T, H, _ = q_nope.shape
    return (q_nope.new_empty(T, H, KV_LORA_RANK, dtype=FP8_DTYPE),
            q_nope.new_empty(T, H, dtype=torch.float32), q_rope.new_empty(T, H, ROPE_DIM))


@torch.library.custom_op("snapmla::decode", mutates_args=())
def _decode(q8: Tensor, q_scale: Tensor, q_rope: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor,
            block_table: Tensor, seq_lens: Tensor, softmax_scale: float, impl: str, splits: int, slots: int,
            pdl: bool, tiling: list[int], follows_q_quant: bool) -> tuple[Tensor, Tensor]:
    B, s_q, H, _ = q8.shape
    plan = decode_plan.DecodePlan(B, s_q, H, impl, splits, slots, pdl, tuple(tiling) if tiling else None)
    return ops.decode_quantized(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens,
                                softmax_scale, follows_q_quant=follows_q_quant, plan=plan)


@_decode.register_fake
def _(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, softmax_scale, impl, splits, slots,
      pdl, tiling, follows_q_quant):
    B, s_q, H, _ = q8.shape
    return (q8.new_empty(B, s_q, H, KV_LORA_RANK, dtype=torch.bfloat16),
            q8.new_empty(B, H, s_q, dtype=torch.float32))


@torch.library.custom_op("snapmla::quantize_and_decode", mutates_args=())
def _quantize_and_decode(q_nope: Tensor, q_rope: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor,
                         block_table: Tensor, seq_lens: Tensor, softmax_scale: float, s_q: int, impl: str, splits: int,
                         slots: int, pdl: bool, tiling: list[int], q_in_decode: bool) -> tuple[Tensor, Tensor]:
    T, H, _ = q_nope.shape
    plan = decode_plan.DecodePlan(T // s_q, s_q, H, impl, splits, slots, pdl, tuple(tiling) if tiling else None,
                                  q_in_decode)
    ops.check_pool(kv_content, kv_scale, kv_rope)
    ops.check_decode_step(block_table, seq_lens, plan, kv_content.shape[0])
    return ops.quantize_and_decode_planned(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens,
                                           softmax_scale, plan)


@_quantize_and_decode.register_fake
def _(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, softmax_scale, s_q, impl, splits, slots,
      pdl, tiling, q_in_decode):
    T, H, _ = q_nope.shape
    return (q_nope.new_empty(T // s_q, s_q, H, KV_LORA_RANK), q_nope.new_empty(T // s_q, H, s_q, dtype=torch.float32))


@torch.library.custom_op("snapmla::append_kv", mutates_args=("kv_content", "kv_scale", "kv_rope"))
def _append_kv(c_kv: Tensor, k_rope: Tensor, loc: Tensor, kv_content: Tensor, kv_scale: Tensor,
               kv_rope: Tensor) -> None:
    ops.append_kv(c_kv, k_rope, loc, kv_content, kv_scale, kv_rope)


@_append_kv.register_fake
def _(c_kv, k_rope, loc, kv_content, kv_scale, kv_rope):
    return None


@torch.library.custom_op("snapmla::fetch_dequant", mutates_args=())
def _fetch_dequant(loc: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor) -> tuple[Tensor, Tensor]:
    return ops.fetch_dequant(loc, kv_content, kv_scale, kv_rope)


@_fetch_dequant.register_fake
def _(loc, kv_content, kv_scale, kv_rope):
    n = loc.shape[0]
    return (kv_rope.new_empty(n, KV_LORA_RANK), kv_rope.new_empty(n, ROPE_DIM))


# ----------------------------------------------------------------------------------------------------------
# what the backend and the pool call
# ----------------------------------------------------------------------------------------------------------
def quantize_q(q_nope: Tensor, q_rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`ops.quantize_q`; the typed op inside a torch.compile trace."""
    if torch.compiler.is_compiling():
        return torch.ops.snapmla.quantize_q(q_nope, q_rope)
    return ops.quantize_q(q_nope, q_rope)


def decode(q8: Tensor, q_scale: Tensor, q_rope: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor,
           block_table: Tensor, seq_lens: Tensor, softmax_scale: float, plan: decode_plan.DecodePlan,
           follows_q_quant: bool = False) -> tuple[Tensor, Tensor]:
    """`ops.decode_planned` (the step checked by `ops.check_decode_step`); inside a trace the typed op (the plan's
    fields as its arguments), which checks every input as `ops.decode_quantized` does."""
    if torch.compiler.is_compiling():
        return torch.ops.snapmla.decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens,
                                        softmax_scale, plan.impl, plan.splits, plan.slots, plan.pdl,
                                        list(plan.tiling or ()), follows_q_quant)
    return ops.decode_planned(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, softmax_scale,
                              plan, follows_q_quant)


def quantize_and_decode(q_nope: Tensor, q_rope: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor,
                        block_table: Tensor, seq_lens: Tensor, softmax_scale: float,
                        plan: decode_plan.DecodePlan) -> tuple[Tensor, Tensor]:
    """`ops.quantize_and_decode_planned` (q_nope [B * s_q, H, 512], q_rope [B * s_q, H, 64] bf16; the step checked by
    `ops.check_decode_step`); inside a trace the typed op, which checks the pool and the step again."""
    if torch.compiler.is_compiling():
        return torch.ops.snapmla.quantize_and_decode(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table,
                                                     seq_lens, softmax_scale, plan.s_q, plan.impl, plan.splits,
                                                     plan.slots, plan.pdl, list(plan.tiling or ()), plan.q_in_decode)
    return ops.quantize_and_decode_planned(q_nope, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens,
                                           softmax_scale, plan)


def append_kv(c_kv: Tensor, k_rope: Tensor, loc: Tensor, kv_content: Tensor, kv_scale: Tensor,
              kv_rope: Tensor) -> None:
    """`ops.append_kv`; the typed op inside a trace."""
    if torch.compiler.is_compiling():
        return torch.ops.snapmla.append_kv(c_kv, k_rope, loc, kv_content, kv_scale, kv_rope)
    return ops.append_kv(c_kv, k_rope, loc, kv_content, kv_scale, kv_rope)


def fetch_dequant(loc: Tensor, kv_content: Tensor, kv_scale: Tensor, kv_rope: Tensor) -> tuple[Tensor, Tensor]:
    """`ops.fetch_dequant` into new tensors; the typed op inside a trace."""
    if torch.compiler.is_compiling():
        return torch.ops.snapmla.fetch_dequant(loc, kv_content, kv_scale, kv_rope)
    return ops.fetch_dequant(loc, kv_content, kv_scale, kv_rope)
