"""tools/convert_block_fp8.py on a small DeepSeek-V3-architecture checkpoint (transformers' own model, saved as
tools/train_tiny_mla.py saves it): the linear layers come back within block quantization's error, with positive
amax-derived scales, everything else byte for byte, and config.json with the released quantization_config."""

import json
from argparse import Namespace

import pytest
import torch
from safetensors import safe_open

from sglang_snapmla import block_fp8
from tools import convert_block_fp8, train_tiny_mla


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    from transformers import DeepseekV3ForCausalLM

    out = tmp_path_factory.mktemp("bf16")
    torch.manual_seed(0)
    cfg = train_tiny_mla.model_config(Namespace(hidden=256, layers=2, heads=2, experts=2, seq_len=128), 1000, 1, 2)
    model = DeepseekV3ForCausalLM(cfg)
    with torch.no_grad():  # trained-like spreads: heavy tails, so that blocks differ in scale
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) * torch.exp(torch.randn(p.shape)) * 0.02)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / "heldout.json").write_text("{}")
    return out


def tensors(folder):
    out = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})
    return out


def test_linear_weights_round_trip_within_block_quantization_error(bf16_checkpoint, tmp_path):
    errors = convert_block_fp8.convert(bf16_checkpoint, tmp_path / "fp8")
    src, dst = tensors(bf16_checkpoint), tensors(tmp_path / "fp8")
    quantized = {n for n in src if convert_block_fp8.quantized_name(n)}
    # per layer: q_a, q_b, kv_a, kv_b, o; layer 0's dense MLP, layer 1's 2 routed + 1 shared expert, 3 each
    assert len(quantized) == 2 * 5 + 3 + 3 * 3 == len(errors)
    for name in src:
        if name not in quantized:
            assert torch.equal(dst[name], src[name]), f"{name} changed"
            continue
        q, scale = dst[name], dst[f"{name}_scale_inv"]
        assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and (scale > 0).all()
        ref = src[name].float()
        err = (block_fp8.dequantize_block_fp8(q, scale) - ref).abs()
        bound = ref.abs() * 2.0**-4 + block_fp8.expand_blocks(scale, ref.shape) * 2.0**-9
        assert (err <= bound * 1.0001).all(), name
        assert errors[name] < 0.05, (name, errors[name])
    assert dst["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape == (5, 2)  # 576 rows: 4.5 blocks
    assert "model.layers.1.mlp.gate.weight_scale_inv" not in dst, "the router stays BF16"
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                             "weight_block_size": [128, 128]}
    assert (tmp_path / "fp8" / "heldout.json").exists() and (tmp_path / "fp8" / "fp8_conversion.json").exists()


def test_sglang_reads_the_converted_config_as_block_fp8(bf16_checkpoint, tmp_path):
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    convert_block_fp8.convert(bf16_checkpoint, tmp_path / "fp8")
    quant = json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"]
    parsed = Fp8Config.from_config(quant)
    assert parsed.is_checkpoint_fp8_serialized and parsed.weight_block_size == [128, 128]


def test_an_fp8_checkpoint_is_not_converted_again(bf16_checkpoint, tmp_path):
    convert_block_fp8.convert(bf16_checkpoint, tmp_path / "fp8")
    with pytest.raises(ValueError, match="already has a quantization_config"):
        convert_block_fp8.convert(tmp_path / "fp8", tmp_path / "again")
