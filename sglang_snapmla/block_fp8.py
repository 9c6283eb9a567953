"""Block-wise FP8 weights as DeepSeek-V3/R1, Kimi-K2 and LongCat-Flash-FP8 ship them (`quantization_config:
{quant_method: fp8, fmt: e4m3, weight_block_size: [128, 128]}`): each 128 x 128 block of a weight's last two dims is
e4m3 with one fp32 scale, stored as `weight_scale_inv` (the factor that multiplies the FP8 values back; the name is
the checkpoints').

    q, scale_inv = quantize_block_fp8(w)        # w [..., N, K] float -> q [..., N, K] e4m3, scale_inv [..., ceil(N/128), ceil(K/128)]
    w_hat = dequantize_block_fp8(q, scale_inv)  # float32 [..., N, K]

A block's scale is its amax / 448 (e4m3's largest finite value), so its largest element maps to +-448 and no element
saturates; an all-zero block gets the smallest normal fp32 scale (its values quantize to 0). The round trip's error
is e4m3's rounding: at most 2^-4 of an element's magnitude for normal values, plus 2^-9 x the block scale for the
subnormal ones (tests/product/test_dummy_weights.py). The scale and the cast are the spec's (`numerics.amax_scale`,
`numerics.to_fp8`), with float32's smallest normal as the floor.
"""

from __future__ import annotations

import torch

from .numerics import amax_scale, to_fp8

BLOCK = (128, 128)


def block_fp8_quantization(quant) -> bool:
    """Whether a model's `quantization_config` (a dict as config.json holds it, an object with those attributes, or
    None) says block-FP8 weights: quant_method fp8 with a weight_block_size."""
    quant = (quant if isinstance(quant, dict) else vars(quant)) if quant else {}
    return quant.get("quant_method") == "fp8" and bool(quant.get("weight_block_size"))


def _check_block(block: tuple[int, int]) -> tuple[int, int]:
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"weight_block_size must be two positive ints, got {block!r}")
    return int(block[0]), int(block[1])


def block_amax(w: torch.Tensor, block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """Largest |w| of each block of the last two dims: [..., ceil(N/bn), ceil(K/bk)] float32 (edge blocks partial)."""
    bn, bk = _check_block(block)
    n, k = w.shape[-2:]
    a = torch.nn.functional.pad(w.float().abs(), (0, -k % bk, 0, -n % bn))
    return a.unflatten(-1, (-1, bk)).unflatten(-3, (-1, bn)).amax(dim=(-3, -1))


def expand_blocks(per_block: torch.Tensor, shape: torch.Size, block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """A per-block tensor [..., ceil(N/bn), ceil(K/bk)] repeated to the elements of a weight of `shape` [..., N, K]."""
    bn, bk = _check_block(block)
    n, k = shape[-2:]
    return per_block.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]


def quantize_block_fp8(w: torch.Tensor, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (any float dtype) -> (q e4m3 [..., N, K], scale_inv float32 [..., ceil(N/bn), ceil(K/bk)]), with
    scale_inv = amax / 448 per block, floored at float32's smallest normal so that q = w / scale_inv stays finite."""
    if not w.is_floating_point():
        raise TypeError(f"quantize_block_fp8 takes a float weight, got {w.dtype}")
    if w.dim() < 2:
        raise ValueError(f"quantize_block_fp8 takes a weight of at least 2 dims, got shape {tuple(w.shape)}")
    scale_inv = amax_scale(block_amax(w, block), floor=torch.finfo(torch.float32).tiny)
    return to_fp8(w.float() / expand_blocks(scale_inv, w.shape, block)), scale_inv


def dequantize_block_fp8(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """The float32 weight a block-FP8 pair stands for: q x its block's scale_inv."""
    bn, bk = _check_block(block)
    n, k = q.shape[-2:]
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape[-2:]) != want or scale_inv.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"scale_inv of shape {tuple(scale_inv.shape)} does not cover a weight of shape "
                         f"{tuple(q.shape)} in {bn} x {bk} blocks (expected [..., {want[0]}, {want[1]}])")
    return q.float() * expand_blocks(scale_inv.float(), q.shape, block)
