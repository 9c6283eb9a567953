"""The small trained model's recipe (tools/train_tiny_mla.py), smoke-sized on CPU: it trains, saves a checkpoint
in the released DeepSeek tensor layout, reloads in transformers with the same loss, and SGLang accepts it with
--attention-backend snapmla."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]

from tools import train_tiny_mla


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


@pytest.mark.cpu_interpreter
def test_sglang_accepts_checkpoint_with_snapmla(checkpoint):
    from sglang.srt.server_args import prepare_server_args

    from sglang_snapmla import plugin
    from sglang_snapmla.sglang_release import resolved

    plugin.register()
    args = resolved(prepare_server_args(["--model-path", str(checkpoint), "--attention-backend", "snapmla",
                                         "--device", "cpu"]))
    assert args.page_size == 64
    # SGLang builds the model from the HF config object: every key of the bundled V3-shape config (which serves on
    # the GPU) must be there, including those transformers' DeepseekV3Config does not define (moe_layer_freq, ...)
    from transformers import AutoConfig

    served = json.loads((ROOT / "configs" / "models" / "deepseek-v3-shape" / "config.json").read_text())
    hf = AutoConfig.from_pretrained(str(checkpoint))
    # rope_theta / rope_scaling: transformers 5 folds them into rope_parameters, which SGLang reads first;
    # aux_loss_alpha: a training-time coefficient nothing at inference reads
    skip = {"rope_theta", "rope_scaling", "aux_loss_alpha"}
    missing = [k for k in served if not k.startswith("_") and k not in skip and not hasattr(hf, k)]
    assert not missing, f"trained checkpoint's config lacks {missing}"


@pytest.fixture(scope="module")
def sharp_checkpoint(tmp_path_factory):
    """A random model of the recipe's architecture with large weights: peaked attention whose output depends on
    every part of the scores (content and RoPE), which a 4-step model's near-uniform attention would not."""
    from types import SimpleNamespace

    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    args = SimpleNamespace(hidden=128, layers=2, heads=4, experts=4, seq_len=128)
    cfg = train_tiny_mla.model_config(args, 1000, 0, 1)
    cfg.initializer_range = 0.15
    out = tmp_path_factory.mktemp("sharp")
    DeepseekV3ForCausalLM(cfg).save_pretrained(out)
    windows = torch.randint(0, 1000, (2, 100), generator=torch.Generator().manual_seed(1)).tolist()
    return out, windows


def test_captured_decode_inputs_reproduce_the_models_attention(sharp_checkpoint):
    """The latents captured for SnapMLA, decoded exactly (fp64 golden) and projected back (W_UV, o_proj), equal the
    model's own attention output at the last position of each window: capture, RoPE and the absorption are right."""
    from transformers import AutoModelForCausalLM

    from sglang_snapmla import numerics as nx
    from study.activations import capture_decode_inputs

    checkpoint, windows = sharp_checkpoint  # 100 tokens: a partial second page
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    attn_out = {}
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.register_forward_hook(lambda m, a, o, i=i: attn_out.__setitem__(i, o[0].detach()))
    with torch.no_grad():
        model(input_ids=torch.tensor(windows))
    captured = capture_decode_inputs(checkpoint, windows, dtype=torch.float32)
    assert len(captured) == len(model.model.layers)
    for i, inputs in enumerate(captured):
        latent, _ = nx.mla_decode_golden(*inputs)  # [B, 1, H, 512]
        attn = model.model.layers[i].self_attn
        cfg = attn.config
        w_uv = attn.kv_b_proj.weight.view(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, 512)
        heads = torch.einsum("bhc,hvc->bhv", latent[:, 0].float(), w_uv[:, cfg.qk_nope_head_dim:])
        got = attn.o_proj(heads.reshape(len(windows), -1))
        ref = attn_out[i][:, -1]
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel < 2e-2, f"layer {i}: rel-L2 {rel:.3e}"  # bf16 latents and absorbed query vs the fp32 model


def test_accuracy_report_on_real_activations(checkpoint, tmp_path):
    from study import accuracy

    accuracy.main(["--checkpoint", str(checkpoint), "--windows", "2", "--window-len", "100", "--out", str(tmp_path),
                   "--no-progress"])
    res = json.loads((tmp_path / "accuracy.json").read_text())
    assert res["source"] == str(checkpoint) and res["layers"] == 2
    snap, bf16 = res["summary"]["SnapMLA"], res["summary"]["BF16"]
    assert 0 < bf16["rel_l2"] < snap["rel_l2"] < 0.1  # FP8 costs more than BF16 rounding, and stays small
    assert all(len(v) == 2 for v in res["per_layer"]["SnapMLA"].values())
    assert (tmp_path / "accuracy.png").stat().st_size > 0


SMALL = ["--max-steps", "2", "--layers", "2", "--hidden", "128", "--heads", "4", "--experts", "4", "--seq-len", "128",
         "--batch", "2", "--eval-windows", "4", "--max-files", "60", "--device", "cpu", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-mla-mtp")
    train_tiny_mla.main(["--out", str(out), *SMALL, "--mtp"])
    return out


def test_the_mtp_layer_is_saved_where_sglangs_nextn_draft_loads_it(mtp_checkpoint):
    """SGLang's DeepSeek loader (its own NextN configuration, both releases) takes the draft from
    model.layers.{num_hidden_layers}: the four NextN tensors by name, the rest as a decoder layer, here a MoE layer
    like layer 1 (first_k_dense_replace 1)."""
    from types import SimpleNamespace

    from sglang.srt.models.deepseek_common.deepseek_weight_loader import DeepseekV2WeightLoaderMixin

    cfg = json.loads((mtp_checkpoint / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["num_hidden_layers"] == 2
    conf = DeepseekV2WeightLoaderMixin._initialize_nextn_conf(SimpleNamespace(config=SimpleNamespace(**cfg)), True)
    with safe_open(str(mtp_checkpoint / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        eh_proj = f.get_tensor(f"{conf.nextn_layer_prefix}.eh_proj.weight")
    prefix = conf.nextn_layer_prefix + "."
    draft = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
    nextn = {n for n in draft if any(s in n for s in conf.nextn_spec_weight_names)}
    assert nextn == {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"}
    assert draft - nextn == {n.removeprefix("model.layers.1.") for n in names if n.startswith("model.layers.1.")}
    assert tuple(eh_proj.shape) == (128, 256) and eh_proj.dtype == torch.bfloat16  # [hidden, enorm(e) ++ hnorm(h)]
    log = json.loads((mtp_checkpoint / "train_log.json").read_text())
    assert math.isfinite(log["heldout_mtp_loss"]) and 0 <= log["heldout_mtp_agreement"] <= 1
    assert [k for k in log["log"][0] if k.endswith("loss")] == ["loss", "mtp_loss"]


def test_the_main_model_of_an_mtp_checkpoint_reloads_without_its_draft(mtp_checkpoint):
    from transformers import AutoModelForCausalLM

    log = json.loads((mtp_checkpoint / "train_log.json").read_text())
    held = json.loads((mtp_checkpoint / "heldout.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(mtp_checkpoint), dtype=torch.float32)
    assert len(model.model.layers) == 2
    x = torch.tensor(held["ppl_windows"][:2])
    with torch.no_grad():
        loss = model(input_ids=x, labels=x).loss.item()
    assert abs(loss - log["heldout_loss"]) < 0.1


def test_mtp_pairs_are_the_draft_extends():
    """SGLang's draft extend shifts a request's tokens left by one beside the target's hidden states, at the target's
    positions: at position i, (hidden_i, token i + 1), whose next token is token i + 2."""
    ids = torch.arange(10, 17)[None]  # tokens 10..16 at positions 0..6
    hidden = torch.arange(7.0)[None, :, None].expand(1, 7, 3)  # hidden_i = i
    tokens, h, positions, targets = train_tiny_mla.mtp_pairs(ids, hidden)
    assert tokens.tolist() == [[11, 12, 13, 14, 15, 16]]
    assert h[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5]]
    assert targets.tolist() == [[12, 13, 14, 15, 16]]


def test_the_mtp_loss_trains_the_mtp_layer_only():
    from types import SimpleNamespace

    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    args = SimpleNamespace(hidden=64, layers=2, heads=2, experts=2, seq_len=32, mtp=True)
    model = DeepseekV3ForCausalLM(train_tiny_mla.model_config(args, 100, 0, 1))
    mtp = train_tiny_mla.add_mtp_layer(model)
    main_params = [p for n, p in model.named_parameters() if not n.startswith("model.layers.2.")]
    assert len(main_params) + len(list(mtp.parameters())) == len(list(model.parameters()))
    _, mtp_loss, draft, logits = train_tiny_mla.losses(model, mtp, torch.randint(0, 100, (2, 16)))
    assert draft.shape == (2, 15, 100) and logits.shape == (2, 16, 100)
    mtp_loss.backward()
    assert all(p.grad is None for p in main_params)  # embedding, head and the main layers: constants to the draft
    assert all(p.grad is not None for n, p in mtp.named_parameters() if "experts" not in n)


def test_mtp_on_one_layer_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        train_tiny_mla.main(["--out", str(tmp_path), *SMALL, "--layers", "1", "--mtp"])
