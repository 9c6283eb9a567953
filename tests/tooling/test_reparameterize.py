"""harness/reparameterize.py (the edit of `python -m tools.reparameterize`): the reparameterized checkpoint is the same
model (float32 logits equal within rounding), its activations have the requested magnitudes, and a wrong
compensation is caught by the same comparison."""

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file

from harness import reparameterize as rp
from tools.train_tiny_mla import model_config

ALPHA, SPREAD = 1024.0, 16.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 2-layer DeepSeek-V3 model whose attention is far from uniform (attention projections scaled up), so
    that a logit the reparameterization got wrong moves the output."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    args = argparse.Namespace(hidden=64, layers=2, heads=2, experts=2, seq_len=64)
    model = DeepseekV3ForCausalLM(model_config(args, vocab=256, bos=0, eos=1))
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_b_proj, layer.self_attn.kv_a_proj_with_mqa):
                proj.weight.mul_(8)
    out = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(out, safe_serialization=True)
    return out


def logits(model_dir, ids, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(1))


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def test_reparameterized_model_computes_the_same_logits(checkpoint, ids, tmp_path):
    out = rp.write_checkpoint(checkpoint, tmp_path / "r", alpha=ALPHA, latent_spread=SPREAD, seed=3)
    ref, new = logits(checkpoint, ids), logits(out, ids)
    assert rel_err(new, ref) < 1e-5, rel_err(new, ref)
    rec = json.loads((out / rp.RECORD).read_text())
    assert rec["alpha"] == ALPHA and rec["latent_spread"] == SPREAD

    # the magnitudes did change where an FP8 cache sees them
    a, b = load_file(str(checkpoint / rp.WEIGHTS)), load_file(str(out / rp.WEIGHTS))
    p = "model.layers.1.self_attn."
    kv_a, kv_a_new = a[p + "kv_a_proj_with_mqa.weight"], b[p + "kv_a_proj_with_mqa.weight"]
    assert torch.equal(kv_a_new[:512], kv_a[:512]) and torch.equal(kv_a_new[512:], kv_a[512:] * ALPHA)
    gains = b[p + "kv_a_layernorm.weight"] / a[p + "kv_a_layernorm.weight"]
    assert gains.max() / gains.min() == SPREAD and set(torch.log2(gains).tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}


@pytest.mark.parametrize("wrong", ["rope_key_only", "latent_uncompensated"])
def test_a_wrong_compensation_changes_the_logits(checkpoint, ids, tmp_path, wrong):
    """The comparison above can fail: alpha on the key without 1/alpha on the query, or the latent gains without
    kv_b_proj's compensation, give another model."""
    if wrong == "rope_key_only":
        rp.write_checkpoint(checkpoint, tmp_path / "w", alpha=ALPHA, edit=rp.uncompensated_query)
    else:
        rp.write_checkpoint(checkpoint, tmp_path / "w", latent_spread=SPREAD, seed=3, edit=rp.uncompensated_latent)
    assert rel_err(logits(tmp_path / "w", ids), logits(checkpoint, ids)) > 1e-2


@pytest.mark.parametrize("beta", [1 / 64, 1 / 8, 1.0, 8.0])
def test_latent_scale_keeps_the_bf16_model(checkpoint, ids, tmp_path, beta):
    """The latent sweep's edit (c_KV x beta, kv_b_proj / beta) leaves the BF16 model's logits as they were, within
    BF16 rounding, while the latent an FP8 cache stores moves by beta."""
    out = rp.write_checkpoint(checkpoint, tmp_path / "b", latent_scale=beta)
    ref, new = logits(checkpoint, ids, torch.bfloat16), logits(out, ids, torch.bfloat16)
    assert rel_err(new.float(), ref.float()) < 1e-2, rel_err(new.float(), ref.float())
    a, b = load_file(str(checkpoint / rp.WEIGHTS)), load_file(str(out / rp.WEIGHTS))
    p = "model.layers.0.self_attn."
    assert torch.equal(b[p + "kv_a_layernorm.weight"].float(), a[p + "kv_a_layernorm.weight"].float() * beta)
    assert torch.equal(b[p + "kv_b_proj.weight"].float(), a[p + "kv_b_proj.weight"].float() / beta)
    assert json.loads((out / rp.RECORD).read_text())["latent_scale"] == beta


def test_latent_scale_without_its_compensation_is_another_model(checkpoint, ids, tmp_path):
    """The comparison above can fail: the latent x 1/8 without kv_b_proj x 8 changes the BF16 logits."""
    rp.write_checkpoint(checkpoint, tmp_path / "w", latent_scale=1 / 8, edit=rp.uncompensated_latent)
    assert rel_err(logits(tmp_path / "w", ids, torch.bfloat16).float(),
                   logits(checkpoint, ids, torch.bfloat16).float()) > 5e-2


def test_factors_must_be_exact_powers_of_two():
    with pytest.raises(ValueError, match="--latent-scale must be a power of two"):
        rp.reparameterize({}, {"kv_lora_rank": 512, "qk_rope_head_dim": 64}, 1.0, latent_scale=0.1)
    with pytest.raises(ValueError, match="power of two"):
        rp.latent_gains(10.0)
    with pytest.raises(ValueError, match="power of four"):
        rp.latent_gains(8.0)
    with pytest.raises(ValueError, match="--alpha must be a power of two"):
        rp.reparameterize({}, {"kv_lora_rank": 512, "qk_rope_head_dim": 64}, 10.0)
    assert torch.equal(rp.latent_gains(1.0), torch.ones(512))
