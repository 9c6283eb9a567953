"""Dummy weights for block-FP8 checkpoints that measure what the deployment runs (`SNAPMLA_DUMMY_WEIGHTS=deployment`).

SGLang's `--load-format dummy` draws every floating-point parameter from U(-1e-3, 1e-3) (`initialize_dummy_weights`).
With a block-FP8 `quantization_config` (DeepSeek-V3/R1, Kimi-K2, LongCat-Flash-FP8) that is not the deployment:
* the FP8 weights: U(+-1e-3) rounds to e4m3, whose smallest subnormal is 2^-9, so ~98 % of them are 0;
* their block scales (`weight_scale_inv`): a signed U(+-1e-3) on 0.5.17 (1.0 on 0.5.23) -- activations collapse;
* the attention layers' `k_scale` / `v_scale`: random, and SGLang's FP8 KV cache (`--kv-cache-dtype fp8_e4m3`)
  divides K and V by them, so that baseline can be silently wrong (SGLang uses 1.0 where a checkpoint has none);
* DeepSeek's router correction bias: U(+-1e-3) is ~30x the spread of the router logits on dummy weights, so every
  token picks the same experts (a trained bias balances the load);
* every projection at U(+-1e-3) shrinks what it outputs ~20-50x (a trained one keeps activations O(1)): the queries
  reach the attention at ~1e-4, below e4m3's smallest subnormal (2^-9) for a per-tensor cast at scale 1, and the
  logits are flat to a few bf16 steps.

With `SNAPMLA_DUMMY_WEIGHTS=deployment` the plugin wraps SGLang's draw (`dummy_weights_hook`) and then, for every
model on that server (any attention backend: the fix is the benchmark's, not snapmla's):
* draws each block-FP8 weight [..., N, K] as U(+-sqrt(3 / K)) -- standard deviation 1 / sqrt(fan-in), the spread
  that keeps a layer's outputs at its inputs' scale -- and quantizes it with positive per-block scales amax / 448
  (`block_fp8.quantize_block_fp8`);
* draws the MoE router's and the LM head's weights (BF16) the same way, so that router logits and output logits
  spread over O(1) as a trained model's do (routing follows the tokens; greedy outputs are not ties);
* sets `k_scale` = `v_scale` = 1.0;
* zeroes the router correction bias, so that routing follows the tokens;
* sets RMSNorm weights to 1.0, so that normalized activations (the MLA latent among them) have unit scale.
The embedding keeps SGLang's draw (the first RMSNorm gives it unit scale). Weights stay seeded (the same model for
every backend of a comparison), and one log line says what was set; after the load, `check_loaded_model` confirms
k_scale = v_scale = 1.0 on every attention layer that has them and raises if not. Without the variable, a dummy load
of a block-FP8 model logs a warning naming it. `benchmarks` / `tools` set it for every dummy-weight server of a
block-FP8 config (`harness.server.dummy_weights_env`).
"""

from __future__ import annotations

import logging

import torch

from .block_fp8 import quantize_block_fp8
from .settings import DUMMY_WEIGHTS_ENV, requested_dummy_weights

logger = logging.getLogger(__name__)

HOOK_TARGET = "sglang.srt.model_loader.loader.initialize_dummy_weights"
CHECK_TARGET = "sglang.srt.model_loader.loader.DummyModelLoader.load_model"
SEED = 4321
ROW_CHUNK = 4096  # rows (or experts) quantized at once: bounds the float32 temporaries on a 1.4 GB expert weight


def requested() -> bool:
    """Whether this process asks for deployment-like dummy weights (block-FP8 weights drawn as a deployment's,
    docs/DEPLOY.md) rather than SGLang's own draw; any other value is refused (`settings.read`)."""
    return requested_dummy_weights() == "deployment"


def fan_in_bound(weight: torch.Tensor) -> float:
    """The half-width of the uniform draw for a weight [..., N, K]: U(+-sqrt(3 / K)) has std 1 / sqrt(K)."""
    return (3.0 / weight.shape[-1]) ** 0.5


def block_fp8_pairs(model: torch.nn.Module):
    """(module, weight name, scale name) for every FP8 weight with block scales: `weight` / `weight_scale_inv` of a
    linear layer, `w13_weight` / `w13_weight_scale_inv` (and w2) of a fused MoE layer."""
    for module in model.modules():
        params = dict(module.named_parameters(recurse=False))
        for name, scale in params.items():
            if not name.endswith("_scale_inv"):
                continue
            base = params.get(name[: -len("_scale_inv")])
            if base is not None and base.dtype == torch.float8_e4m3fn and scale.dim() == base.dim():
                yield module, name[: -len("_scale_inv")], name


def _block_size(weight: torch.Tensor, scale: torch.Tensor) -> tuple[int, int]:
    """The block a scale tensor covers: 128 x 128 in every released checkpoint, read back from the shapes."""
    n, k = weight.shape[-2:]
    sn, sk = scale.shape[-2:]
    for b in (128, 64, 256):  # the sizes checkpoints use; 128 first
        if (-(-n // b), -(-k // b)) == (sn, sk):
            return b, b
    raise ValueError(f"a block-FP8 weight of shape {tuple(weight.shape)} with scales {tuple(scale.shape)} has no "
                     "square block size of 64, 128 or 256; this checkpoint's layout is not one snapmla's dummy "
                     f"weights know (unset {DUMMY_WEIGHTS_ENV})")


@torch.no_grad()
def redraw_block_fp8(weight: torch.Tensor, scale: torch.Tensor, generator: torch.Generator) -> None:
    """weight (e4m3) and scale (fp32) in place: a U(+-sqrt(3 / K)) weight quantized with amax / 448 block scales."""
    block = _block_size(weight, scale)
    w2, s2 = weight.view(-1, *weight.shape[-2:]), scale.view(-1, *scale.shape[-2:])  # [experts or 1, N, K]
    rows = max(block[0], ROW_CHUNK // block[0] * block[0])
    bound = fan_in_bound(weight)
    for e in range(w2.shape[0]):
        for r0 in range(0, w2.shape[1], rows):
            part = w2[e, r0:r0 + rows]
            w = torch.empty(part.shape, dtype=torch.float32, device=part.device)
            w.uniform_(-bound, bound, generator=generator)
            q, s = quantize_block_fp8(w, block)
            part.copy_(q)
            s2[e, r0 // block[0]:r0 // block[0] + s.shape[0]].copy_(s)


@torch.no_grad()
def redraw_fan_in(weight: torch.Tensor, generator: torch.Generator) -> None:
    """A BF16 / fp32 weight [..., K] in place: U(+-sqrt(3 / K)), drawn in float32 (the generator's stream does not
    depend on the weight's dtype)."""
    bound = fan_in_bound(weight)
    flat = weight.view(-1, weight.shape[-1])
    for r0 in range(0, flat.shape[0], ROW_CHUNK):
        w = torch.empty(flat[r0:r0 + ROW_CHUNK].shape, dtype=torch.float32, device=weight.device)
        flat[r0:r0 + ROW_CHUNK].copy_(w.uniform_(-bound, bound, generator=generator))


def _is_router(module: torch.nn.Module) -> bool:
    """DeepSeek's MoEGate: its weight [experts, hidden] beside the correction bias (V3 / R1 / Kimi-K2)."""
    return (isinstance(getattr(module, "e_score_correction_bias", None), torch.Tensor)
            and isinstance(getattr(module, "weight", None), torch.Tensor))


def _is_rms_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor)


@torch.no_grad()
def make_deployment_like(model: torch.nn.Module) -> dict:
    """The fix-ups above, in place, on a model SGLang has just filled with its dummy draw; returns what was set."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(SEED)
    counts = {"block_fp8_weights": 0, "kv_scales": 0, "correction_biases": 0, "routers": 0, "lm_heads": 0,
              "rms_norms": 0}
    scale_range = [float("inf"), 0.0]
    for module, weight_name, scale_name in block_fp8_pairs(model):
        scale = getattr(module, scale_name)
        redraw_block_fp8(getattr(module, weight_name), scale, generator)
        scale_range = [min(scale_range[0], scale.min().item()), max(scale_range[1], scale.max().item())]
        counts["block_fp8_weights"] += 1
    for name, module in model.named_modules():
        if isinstance(getattr(module, "k_scale", None), torch.nn.Parameter):
            module.k_scale.fill_(1.0)
            module.v_scale.fill_(1.0)
            counts["kv_scales"] += 1
        if isinstance(getattr(module, "e_score_correction_bias", None), torch.Tensor):
            module.e_score_correction_bias.zero_()
            counts["correction_biases"] += 1
        router = _is_router(module)
        if router or name.rsplit(".", 1)[-1] == "lm_head":
            redraw_fan_in(module.weight, generator)
            counts["routers" if router else "lm_heads"] += 1
        if _is_rms_norm(module):
            module.weight.fill_(1.0)
            counts["rms_norms"] += 1
    if counts["block_fp8_weights"]:
        counts["block_scale_range"] = scale_range
    return counts


def dummy_weights_hook(original, model, *args, **kwargs):
    """Around SGLang's `initialize_dummy_weights(model)`: its draw, then `make_deployment_like` where requested (a
    warning naming the switch where a block-FP8 model is not)."""
    result = original(model, *args, **kwargs)
    if not requested():
        if next(block_fp8_pairs(model), None) is not None:
            logger.warning("--load-format dummy with block-FP8 weights: SGLang's draw makes ~98 %% of them 0 (and "
                           "randomizes k_scale / v_scale and the router bias), so speed measured this way is not the "
                           "deployment's; set %s=deployment for weights drawn as a deployment's (docs/DEPLOY.md)",
                           DUMMY_WEIGHTS_ENV)
        return result
    counts = make_deployment_like(model)
    if not counts["block_fp8_weights"]:
        logger.warning("%s=deployment: this model has no block-FP8 weights; only k/v scales, router bias and norms "
                       "were set (%s)", DUMMY_WEIGHTS_ENV, counts)
    logger.info("snapmla dummy weights (%s=deployment): %s", DUMMY_WEIGHTS_ENV, counts)
    return result


def check_loaded_model(model: torch.nn.Module) -> int:
    """After the load (SGLang has turned k_scale / v_scale into floats): every attention layer's KV scales are 1.0.
    Returns how many layers were checked; RuntimeError naming the layer otherwise."""
    checked = 0
    for name, module in model.named_modules():
        k, v = getattr(module, "k_scale_float", None), getattr(module, "v_scale_float", None)
        if k is None and v is None:
            continue
        if k != 1.0 or v != 1.0:
            raise RuntimeError(f"{name}: k_scale {k}, v_scale {v} after the dummy load, not 1.0: the FP8 KV cache "
                               f"baseline would divide K and V by them ({DUMMY_WEIGHTS_ENV}=deployment)")
        checked += 1
    return checked


def load_model_check_hook(original, loader, *args, **kwargs):
    """Around `DummyModelLoader.load_model`: the loaded model passes `check_loaded_model` where requested."""
    model = original(loader, *args, **kwargs)
    if requested():
        logger.info("snapmla dummy weights: k_scale = v_scale = 1.0 on %d attention layers (checked)",
                    check_loaded_model(model))
    return model
