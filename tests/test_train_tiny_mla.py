"""The small trained model's recipe (examples/train_tiny_mla.py), smoke-sized on CPU: it trains, saves a checkpoint
in the released DeepSeek tensor layout, reloads in transformers with the same loss, and SGLang accepts it with
--attention-backend snapmla."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train_tiny_mla  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-mla")
    train_tiny_mla.main(["--out", str(out), "--max-steps", "4", "--layers", "2", "--hidden", "128", "--heads", "4",
                         "--experts", "4", "--seq-len", "128", "--batch", "2", "--eval-windows", "4",
                         "--max-files", "60", "--device", "cpu", "--lr", "3e-3"])
    return out


def test_held_out_split_is_deterministic_and_disjoint():
    paths = [f"pkg/mod{i}.py" for i in range(200)]
    held = {p for p in paths if train_tiny_mla.is_held_out(p)}
    assert 5 <= len(held) <= 40  # ~1 in 10
    assert held == {p for p in paths if train_tiny_mla.is_held_out(p)}


def test_checkpoint_layout_and_reload(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["kv_lora_rank"] == 512 and cfg["qk_rope_head_dim"] == 64
    assert cfg["rope_parameters"]["rope_type"] == "yarn"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    # per-expert tensors and separate q_a / kv_a projections: the names SGLang's DeepSeek loader maps
    for name in ("model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                 "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.self_attn.q_a_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight", "lm_head.weight"):
        assert name in names, name
    log = json.loads((checkpoint / "train_log.json").read_text())
    assert log["steps"] == 4 and math.isfinite(log["heldout_loss"])
    first, last = log["log"][0]["loss"], log["heldout_loss"]
    assert last < first  # four steps at lr 3e-3 already move the loss down from ln(32000) ~ 10.4
    held = json.loads((checkpoint / "heldout.json").read_text())
    assert len(held["prompts"]) == 64 and all(len(p) == 256 for p in held["prompts"])

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    x = torch.tensor(held["ppl_windows"][:2])
    with torch.no_grad():
        loss = model(input_ids=x, labels=x).loss.item()
    assert abs(loss - log["heldout_loss"]) < 0.1  # same weights (bf16-rounded) give the same held-out loss


def test_sglang_accepts_checkpoint_with_snapmla(checkpoint):
    from sglang.srt.server_args import prepare_server_args

    from sglang_snapmla import plugin

    plugin.register()
    args = prepare_server_args(["--model-path", str(checkpoint), "--attention-backend", "snapmla",
                                "--device", "cpu"])
    assert args.page_size == 64

