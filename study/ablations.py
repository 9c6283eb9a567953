"""The accuracy study's configurations: what SnapMLA is compared with (`accuracy`, tools/p_scale_study.py).

The paper's ablations A-D (Table 2: RoPE-unaware per-token FP8, per-tensor static and dynamic scales, per-block
scales), the BF16 cache, and two P' scale rules a kernel could use instead of SnapMLA's amax rule (power-of-two
scales; a scale from a bound the softmax already has), each measured and not used (docs/ACCURACY.md). Every
configuration runs the spec's reference decode (`numerics.snapmla_decode_reference`) with other quantizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sglang_snapmla.layout import PAGE_SIZE
from sglang_snapmla.numerics import (P_SCALE_FLOOR, LatentCache, QuantizedQuery, amax_p_scale, amax_scale, quantize_kv, quantize_q,
                       quantize_with_scale, snapmla_decode_reference)


def pow2_scale(amax: torch.Tensor, floor: float) -> torch.Tensor:
    """The smallest power of two >= amax_scale(amax, floor): dividing by it is exact (an exponent subtraction) and
    the quotient stays <= 448, so nothing saturates. (AMLA-style scales: rescaling becomes an exponent add.)"""
    s = amax_scale(amax, floor)
    mant, exp = torch.frexp(s)  # s = mant * 2**exp, mant in [0.5, 1)
    return torch.ldexp(torch.ones_like(s), exp - (mant == 0.5).to(exp.dtype))


def pow2_p_scale(p_v: torch.Tensor, p: torch.Tensor, ks_visible: torch.Tensor) -> torch.Tensor:
    """SnapMLA-pow2P: the amax rule rounded up to a power of two (exact division, exponent-add rescaling)."""
    return pow2_scale(p_v.amax(1), P_SCALE_FLOOR)


def bound_p_scale(p_v: torch.Tensor, p: torch.Tensor, ks_visible: torch.Tensor) -> torch.Tensor:
    """SnapMLA-boundP: max_j P_j x max_j sigma_kj over the row's visible keys, a bound >= amax(P') a kernel knows
    without a max over P' (the saturating fp8 cast absorbs the bound's rounding)."""
    return amax_scale(p.amax(1) * ks_visible.amax(1), P_SCALE_FLOOR)


@dataclass(frozen=True)
class QuantConfig:
    """How one configuration quantizes the cache and the queries, and how the decode rounds P'."""

    name: str
    description: str
    quantize_kv: Callable[[torch.Tensor, torch.Tensor], LatentCache]
    quantize_q: Callable[[torch.Tensor, torch.Tensor], QuantizedQuery]
    p_scale: Callable[..., torch.Tensor] | None = amax_p_scale  # snapmla_decode_reference's P' rule (None: bf16 P)


def _rope_unaware_per_row(content, rope):
    """Config A: one scale per row over all 576 dims; RoPE goes through FP8 with the content."""
    amax = torch.maximum(content.float().abs().amax(-1), rope.float().abs().amax(-1))
    return quantize_with_scale(content, rope, amax_scale(amax), rope_to_fp8=True)


def _static_unit(content, rope):
    """Config B: per-tensor static scale 1.0, RoPE-aware (RoPE kept in bf16)."""
    return quantize_with_scale(content, rope, torch.ones(content.shape[:-1], device=content.device))


def _per_tensor_dynamic(content, rope):
    """Config C: one dynamic scale for the whole tensor (amax over all of it), RoPE-aware."""
    scale = amax_scale(content.float().abs().amax()).expand(content.shape[:-1])
    return quantize_with_scale(content, rope, scale)


def _per_block_kv(content, rope):
    """Config D, cache side: one scale per 64-token page (slots [64p, 64p+64)), RoPE-aware."""
    S = content.shape[0]
    if S % PAGE_SIZE:
        raise ValueError(f"per-block quantization needs whole pages; got {S} slots")
    amax = content.float().abs().reshape(S // PAGE_SIZE, -1).amax(-1)
    return quantize_with_scale(content, rope, amax_scale(amax).repeat_interleave(PAGE_SIZE))


def _per_block_q(content, rope):
    """Config D, query side: one scale per query token shared by all its heads, RoPE-aware."""
    amax = content.float().abs().amax(dim=(-2, -1), keepdim=False)
    return quantize_with_scale(content, rope, amax_scale(amax).unsqueeze(-1).expand(content.shape[:-1]))


def _bf16(content, rope):
    ones = torch.ones(content.shape[:-1], device=content.device)
    return content.to(torch.bfloat16), ones, rope.to(torch.bfloat16)


def _kv(fn):
    return lambda c, r: LatentCache(*fn(c, r))


def _q(fn):
    return lambda c, r: QuantizedQuery(*fn(c, r))


CONFIGS: dict[str, QuantConfig] = {
    "SnapMLA": QuantConfig("SnapMLA", "per-token FP8, RoPE-aware (bf16 RoPE, scale-aligned)", quantize_kv, quantize_q),
    "A": QuantConfig("A", "per-token FP8, RoPE-unaware (all 576 dims in FP8)",
                     _kv(_rope_unaware_per_row), _q(_rope_unaware_per_row)),
    "B": QuantConfig("B", "per-tensor static scale 1.0, RoPE-aware", _kv(_static_unit), _q(_static_unit)),
    "C": QuantConfig("C", "per-tensor dynamic scale, RoPE-aware", _kv(_per_tensor_dynamic), _q(_per_tensor_dynamic)),
    "D": QuantConfig("D", "per-block FP8 (64-token page / per-token Q), RoPE-aware", _kv(_per_block_kv),
                     _q(_per_block_q)),
    "SnapMLA-pow2P": QuantConfig("SnapMLA-pow2P", "SnapMLA with power-of-two P block scales (exact division, "
                                 "exponent-add rescaling)", quantize_kv, quantize_q, pow2_p_scale),
    "SnapMLA-boundP": QuantConfig("SnapMLA-boundP", "SnapMLA with P block scales from max P x max sigma_k "
                                  "(no max over P'; a kernel candidate)", quantize_kv, quantize_q, bound_p_scale),
    "BF16": QuantConfig("BF16", "BF16 cache and queries, bf16 P (FlashMLA-like)", _kv(_bf16), _q(_bf16), None),
}


def decode_with_config(config: QuantConfig | str, q_nope, q_rope, c_kv, k_rope, block_table, seq_lens,
                       softmax_scale):
    """Quantize the unquantized inputs with ``config`` and run the reference decode. Shapes as the golden."""
    if isinstance(config, str):
        config = CONFIGS[config]
    cache = config.quantize_kv(c_kv, k_rope)
    q = config.quantize_q(q_nope, q_rope)
    return snapmla_decode_reference(q, cache, block_table, seq_lens, softmax_scale, p_scale=config.p_scale)


