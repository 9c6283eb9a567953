"""Block-FP8 weights (`block_fp8`) and dummy weights that are a deployment's (`dummy_weights`), through SGLang's own
`initialize_dummy_weights` as its dummy loader calls it."""

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from sglang_snapmla import block_fp8, dummy_weights
from sglang_snapmla.dummy_weights import DUMMY_WEIGHTS_ENV
from sglang_snapmla.settings import CHECK_INDICES_ENV

ROOT = Path(__file__).resolve().parents[2]
FP8_CONFIGS = ["deepseek-v3-fp8-tp8", "deepseek-v3-fp8-dp-attention", "kimi-k2-fp8-tp8", "kimi-k2-fp8-dp-attention"]


# ---------------------------------------------------------------------------------------------------------------
# block FP8
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(256, 384), (300, 200), (3, 130, 257)])
def test_block_fp8_round_trip_within_e4m3_rounding(shape):
    """Fresh random weights with a heavy-tailed spread and one all-zero block: every block's largest element maps to
    +-448, the round trip errs by e4m3's rounding only (2^-4 relative for normal values, 2^-9 of the block scale for
    subnormal ones), and the zero block stays zero. One block is a millionth as large: its scale lies far below the
    2^-20 that floors the KV cache's scales, and weights keep their precision there too (fp32's smallest normal is
    their floor)."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    w = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    w[..., :128, :128] = 0
    last = w[..., (shape[-2] - 1) // 128 * 128:, (shape[-1] - 1) // 128 * 128:]  # the last block (partial or whole)
    last *= 1e-6 / last.abs().amax()
    q, s = block_fp8.quantize_block_fp8(w.to(torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128))
    assert (s > 0).all()
    w_hat = block_fp8.dequantize_block_fp8(q, s)
    ref = w.to(torch.bfloat16).float()
    err = (w_hat - ref).abs()
    bound = ref.abs() * 2.0**-4 + block_fp8.expand_blocks(s, ref.shape) * 2.0**-9
    assert (err <= bound * 1.0001).all(), (err / bound).max()
    assert (w_hat[..., :128, :128] == 0).all()
    nonzero = block_fp8.block_amax(ref) > 0
    assert torch.equal(block_fp8.block_amax(q.float())[nonzero], torch.full_like(s, 448.0)[nonzero])


def test_dequantize_refuses_scales_that_do_not_cover_the_weight():
    q, s = block_fp8.quantize_block_fp8(torch.randn(256, 256))
    with pytest.raises(ValueError, match=r"expected \[\.\.\., 2, 2\]"):
        block_fp8.dequantize_block_fp8(q, s[:1])
    q3, s3 = block_fp8.quantize_block_fp8(torch.randn(3, 256, 256))
    with pytest.raises(ValueError, match=r"does not cover a weight of shape \(3, 256, 256\)"):
        block_fp8.dequantize_block_fp8(q3, s3[:1])  # one expert's scales would broadcast over all three


def test_block_fp8_blocks_are_rows_by_columns():
    """A block size of [rows, columns] that is not square (a config's weight_block_size may say so): each block's
    scale is the amax of its own rows and columns over 448, element by element."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    w = torch.randn(130, 100, generator=g) * torch.exp(torch.randn(130, 100, generator=g) * 2)
    q, s = block_fp8.quantize_block_fp8(w, (64, 32))
    assert s.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            block = w[64 * i:64 * (i + 1), 32 * j:32 * (j + 1)]
            assert s[i, j] == block.abs().amax() / 448
            assert torch.equal(q[64 * i:64 * (i + 1), 32 * j:32 * (j + 1)], (block / s[i, j]).to(torch.float8_e4m3fn))
    assert torch.equal(block_fp8.dequantize_block_fp8(q, s, (64, 32)),
                       q.float() * s.repeat_interleave(64, 0)[:130].repeat_interleave(32, 1)[:, :100])


def test_quantize_refuses_an_integer_weight():
    with pytest.raises(TypeError, match="takes a float weight, got torch.int32"):
        block_fp8.quantize_block_fp8(torch.ones(256, 256, dtype=torch.int32))


@pytest.mark.parametrize("weight, block, error", [
    (torch.randn(256), (128, 128), "at least 2 dims, got shape \\(256,\\)"),
    (torch.randn(256, 256), (0, 128), "two positive ints, got \\(0, 128\\)"),
    (torch.randn(256, 256), (128,), "two positive ints"),
])
def test_quantize_refuses_what_has_no_blocks(weight, block, error):
    with pytest.raises(ValueError, match=error):
        block_fp8.quantize_block_fp8(weight, block)


# ---------------------------------------------------------------------------------------------------------------
# dummy weights
# ---------------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))


class BlockFp8Linear(nn.Module):
    """The parameters SGLang's Fp8LinearMethod creates for a block-FP8 checkpoint."""

    def __init__(self, n, k):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, k, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale_inv = nn.Parameter(torch.empty(-(-n // 128), -(-k // 128)), requires_grad=False)


class FusedMoE(nn.Module):
    """The parameters SGLang's Fp8MoEMethod creates: per-expert w13 / w2 with block scales."""

    def __init__(self, experts, hidden, inter):
        super().__init__()
        self.w13_weight = nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn),
                                       requires_grad=False)
        self.w13_weight_scale_inv = nn.Parameter(torch.empty(experts, 2 * inter // 128, hidden // 128),
                                                 requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(experts, hidden, inter, dtype=torch.float8_e4m3fn),
                                      requires_grad=False)
        self.w2_weight_scale_inv = nn.Parameter(torch.empty(experts, hidden // 128, inter // 128),
                                                requires_grad=False)


class Attention(nn.Module):
    """RadixAttention under an FP8 quant config: k_scale / v_scale parameters (BaseKVCacheMethod.create_weights)."""

    def __init__(self):
        super().__init__()
        self.k_scale = nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        self.v_scale = nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        self.k_scale_float = self.v_scale_float = None


class Gate(nn.Module):
    def __init__(self, experts, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.empty(experts))


def tiny_block_fp8_model():
    m = nn.Module()
    m.norm = RMSNorm(256)
    m.q_b_proj = BlockFp8Linear(300, 384)  # a partial edge block; a fan-in unlike the experts'
    m.lm_head = nn.Linear(256, 64, bias=False, dtype=torch.bfloat16)
    m.experts = FusedMoE(experts=3, hidden=256, inter=256)
    m.attn = Attention()
    m.gate = Gate(experts=3, hidden=256)
    m.embed = nn.Parameter(torch.empty(64, 256, dtype=torch.bfloat16))
    return m


def sglang_dummy_init(model):
    """SGLang's own dummy draw, as `DummyModelLoader.load_model` calls it (through the plugin's hook where the plugin
    is registered)."""
    from sglang.srt.model_loader import loader

    loader.initialize_dummy_weights(model)


def process_kv_scales(model):
    """What SGLang's `BaseKVCacheMethod.process_weights_after_loading` does with the drawn scales (0.5.17 and 0.5.23)."""
    from sglang.srt.layers.quantization.kv_cache import BaseKVCacheMethod

    for module in model.modules():
        if isinstance(module, Attention):
            BaseKVCacheMethod(None).process_weights_after_loading(module)


def fp8_weights_as_deployed(model) -> dict:
    """What a deployment's block-FP8 weights look like, measured: scale signs, the share of zero FP8 values, each
    block's largest FP8 value (448 when the scale is amax / 448), the dequantized weights' spread."""
    out = {"scales_positive": True, "zero_share": 0.0, "amax_448": True, "std": [], "fan_in": []}
    for module, w_name, s_name in dummy_weights.block_fp8_pairs(model):
        q, s = getattr(module, w_name), getattr(module, s_name)
        out["scales_positive"] &= bool((s > 0).all())
        out["zero_share"] = max(out["zero_share"], (q.float() == 0).float().mean().item())
        out["amax_448"] &= bool((block_fp8.block_amax(q.float()) == 448).all())
        out["std"].append(block_fp8.dequantize_block_fp8(q, s).std().item())
        out["fan_in"].append(q.shape[-1])
    return out


@pytest.fixture
def registered():
    from sglang_snapmla import plugin

    plugin.register()


def test_sglang_draw_of_block_fp8_weights_is_not_a_deployment(registered, monkeypatch):
    """Without the switch, SGLang's draw stands (and is what the measure below flags): most FP8 weights 0, scales
    of both signs on 0.5.17, so the check in the next test can fail."""
    monkeypatch.delenv(DUMMY_WEIGHTS_ENV, raising=False)
    m = tiny_block_fp8_model()
    sglang_dummy_init(m)
    seen = fp8_weights_as_deployed(m)
    assert seen["zero_share"] > 0.9 and not seen["amax_448"]


@pytest.mark.parametrize("row_chunk", [None, 16])
def test_deployment_dummy_weights_through_sglangs_loader(registered, monkeypatch, caplog, row_chunk):
    """With SNAPMLA_DUMMY_WEIGHTS=deployment, SGLang's dummy draw (wrapped by the plugin) gives block-FP8 weights
    with a spread of 1 / sqrt(fan-in) and positive amax / 448 scales, router and LM head drawn at the same spread,
    k_scale = v_scale = 1.0 (set on the parameters, and after SGLang's own processing), a zero router bias and unit
    norms; the same seed gives the same weights. row_chunk 16: every weight redrawn in several row chunks (a real
    model's 24 576-row q_b_proj and 129 280-row LM head take several of the default 4 096), each chunk's rows and
    block scales where they belong."""
    monkeypatch.setenv(DUMMY_WEIGHTS_ENV, "deployment")
    if row_chunk:
        monkeypatch.setattr(dummy_weights, "ROW_CHUNK", row_chunk)
    m = tiny_block_fp8_model()
    with caplog.at_level(logging.INFO, logger="sglang_snapmla.dummy_weights"):
        sglang_dummy_init(m)
    assert m.attn.k_scale.item() == m.attn.v_scale.item() == 1.0
    seen = fp8_weights_as_deployed(m)
    assert seen["scales_positive"] and seen["amax_448"] and seen["zero_share"] < 0.02
    assert sorted(set(seen["fan_in"])) == [256, 384]
    for std, k in zip(seen["std"], seen["fan_in"]):  # U(+-sqrt(3 / K)) has std 1 / sqrt(K)
        assert std == pytest.approx(k**-0.5, rel=0.05)
    for w in (m.gate.weight, m.lm_head.weight):
        assert w.float().std().item() == pytest.approx(256**-0.5, rel=0.05)
    assert m.embed.float().abs().max().item() <= 1e-3  # SGLang's draw: the first norm gives it unit scale
    process_kv_scales(m)
    assert m.attn.k_scale_float == m.attn.v_scale_float == 1.0
    assert dummy_weights.check_loaded_model(m) == 1
    assert (m.gate.e_score_correction_bias == 0).all() and (m.norm.weight == 1).all()
    assert "'block_fp8_weights': 3" in caplog.text and "'kv_scales': 1" in caplog.text
    assert "'routers': 1, 'lm_heads': 1" in caplog.text
    again = tiny_block_fp8_model()
    sglang_dummy_init(again)
    assert torch.equal(again.experts.w2_weight.float(), m.experts.w2_weight.float())
    assert torch.equal(again.lm_head.weight, m.lm_head.weight)


def test_block_fp8_dummy_load_without_the_switch_warns(registered, monkeypatch, caplog):
    monkeypatch.delenv(DUMMY_WEIGHTS_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="sglang_snapmla.dummy_weights"):
        sglang_dummy_init(tiny_block_fp8_model())
    assert f"set {DUMMY_WEIGHTS_ENV}=deployment" in caplog.text


@pytest.mark.parametrize("k, v", [(1.0, 0.00042), (0.00031, 1.0)])
def test_loaded_model_check_names_a_kv_scale_that_is_not_one(k, v):
    """Either scale off stops the start, naming the layer; with both 1.0 every attention layer counts."""
    m = tiny_block_fp8_model()
    m.attn2 = Attention()
    m.attn.k_scale_float = m.attn.v_scale_float = m.attn2.k_scale_float = m.attn2.v_scale_float = 1.0
    assert dummy_weights.check_loaded_model(m) == 2
    m.attn2.k_scale_float, m.attn2.v_scale_float = k, v
    with pytest.raises(RuntimeError, match=rf"attn2: k_scale {k}, v_scale {v}"):
        dummy_weights.check_loaded_model(m)


def test_only_fp8_weights_with_block_scales_are_redrawn_and_the_logged_scale_range_is_theirs():
    """A BF16 weight beside a `*_scale_inv` and an FP8 weight whose scale is not a block grid of its rank are not
    block-FP8 pairs and keep their values; the reported scale range is the smallest and largest block scale drawn."""
    m = tiny_block_fp8_model()
    m.bf16_proj = nn.Module()
    m.bf16_proj.weight = nn.Parameter(torch.full((256, 256), 0.5, dtype=torch.bfloat16), requires_grad=False)
    m.bf16_proj.weight_scale_inv = nn.Parameter(torch.full((2, 2), 3.0), requires_grad=False)
    m.per_tensor = nn.Module()
    m.per_tensor.weight = nn.Parameter(torch.full((256, 256), 2.0).to(torch.float8_e4m3fn), requires_grad=False)
    m.per_tensor.weight_scale_inv = nn.Parameter(torch.tensor([3.0]), requires_grad=False)
    counts = dummy_weights.make_deployment_like(m)
    assert counts["block_fp8_weights"] == 3
    assert (m.bf16_proj.weight == 0.5).all() and (m.bf16_proj.weight_scale_inv == 3.0).all()
    assert (m.per_tensor.weight.float() == 2.0).all() and m.per_tensor.weight_scale_inv.item() == 3.0
    scales = torch.cat([getattr(mod, s).flatten() for mod, _, s in dummy_weights.block_fp8_pairs(m)])
    assert counts["block_scale_range"] == [scales.min().item(), scales.max().item()]


@pytest.mark.parametrize("block", [64, 128, 256])
def test_a_weight_of_each_known_block_size_is_redrawn_on_its_own_grid(block):
    """The block a weight's scales cover is read back from the two shapes (128 in the released checkpoints; 64 and
    256 known too): the redraw fills that grid with positive amax / 448 scales, every block's largest FP8 value 448;
    a grid of no known square block is refused by name."""
    n, k = 512, 768
    weight = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.full((n // block, k // block), -1e-3)  # SGLang's signed draw on 0.5.17
    dummy_weights.redraw_block_fp8(weight, scale, torch.Generator().manual_seed(0))
    assert (scale > 0).all()
    assert (block_fp8.block_amax(weight.float(), (block, block)) == 448).all()
    assert block_fp8.dequantize_block_fp8(weight, scale, (block, block)).std().item() == pytest.approx(k**-0.5,
                                                                                                        rel=0.05)
    with pytest.raises(ValueError, match="has no square block size of 64, 128 or 256"):
        dummy_weights.redraw_block_fp8(weight, torch.ones(n // 32, k // 32), torch.Generator())


def test_a_model_without_block_fp8_weights_says_what_was_set(registered, monkeypatch, caplog):
    """SNAPMLA_DUMMY_WEIGHTS=deployment on a BF16 model: the KV scales, router bias and norms are still set, and a
    warning says the model has no block-FP8 weights (a BF16 config served with the switch on, by mistake)."""
    monkeypatch.setenv(DUMMY_WEIGHTS_ENV, "deployment")
    m = tiny_block_fp8_model()
    for name in ("q_b_proj", "experts"):  # its block-FP8 layers
        delattr(m, name)
    with caplog.at_level(logging.WARNING, logger="sglang_snapmla.dummy_weights"):
        sglang_dummy_init(m)
    assert "this model has no block-FP8 weights; only k/v scales, router bias and norms were set" in caplog.text
    assert m.attn.k_scale.item() == 1.0 and (m.gate.e_score_correction_bias == 0).all()


def test_the_load_check_runs_only_where_deployment_weights_were_asked_for(monkeypatch):
    """The hook around DummyModelLoader.load_model: without the switch a dummy load keeps SGLang's random KV scales
    (a BF16 config's server, or one measuring SGLang's own draw, must start); with it, a scale that is not 1.0 stops
    the start, naming the layer."""
    def load(loader):
        m = tiny_block_fp8_model()
        m.attn.k_scale_float, m.attn.v_scale_float = 0.00031, 0.00042  # SGLang's draw, after its processing
        return m

    monkeypatch.delenv(DUMMY_WEIGHTS_ENV, raising=False)
    assert dummy_weights.load_model_check_hook(load, None).attn.k_scale_float == 0.00031
    monkeypatch.setenv(DUMMY_WEIGHTS_ENV, "deployment")
    with pytest.raises(RuntimeError, match=r"attn: k_scale 0.00031, v_scale 0.00042"):
        dummy_weights.load_model_check_hook(load, None)


def test_the_plugin_hooks_both_steps_of_sglangs_dummy_load():
    """The plugin wraps both of SGLang's dummy-load steps, the draw and the loaded model (the hooks' behaviour is
    tested above): without the second, a deployment-weight server would start on SGLang's random KV scales
    unchecked."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_snapmla import plugin

    hooks = plugin.sglang_hooks(HookType)
    assert hooks[dummy_weights.HOOK_TARGET] == (dummy_weights.dummy_weights_hook, HookType.AROUND)
    assert hooks[dummy_weights.CHECK_TARGET] == (dummy_weights.load_model_check_hook, HookType.AROUND)


def test_an_unknown_switch_value_is_refused(monkeypatch):
    monkeypatch.setenv(DUMMY_WEIGHTS_ENV, "real")
    with pytest.raises(ValueError, match="'deployment'"):
        dummy_weights.requested()


@pytest.mark.parametrize("switch,value", [(DUMMY_WEIGHTS_ENV, "real"), (CHECK_INDICES_ENV, "true")])
def test_an_unknown_switch_value_stops_a_server_command_when_the_plugin_loads(switch, value):
    """SGLang's plugin loader logs a plugin's exception and goes on, which would serve SGLang's own dummy draw (or
    without the index checks asked for): the plugin stops the command instead, with one line (any backend: the
    switches are the process's)."""
    import os
    import subprocess
    import sys

    argv = ["--model-path", str(ROOT / "configs/models/deepseek-v2-lite-shape"), "--load-format", "dummy",
            "--attention-backend", "triton", "--device", "cpu"]
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], capture_output=True, text=True,
                         timeout=300, env={**os.environ, switch: value})
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0 and last.startswith(f"sglang-snapmla: {switch}={value!r}: set it to"), \
        res.stderr[-2000:]


@pytest.mark.parametrize("name", FP8_CONFIGS)
def test_harness_asks_fp8_configs_for_deployment_dummy_weights(name):
    from harness.server import dummy_weights_env

    model = str(ROOT / "configs/models" / name)
    assert dummy_weights_env(model, "dummy") == {DUMMY_WEIGHTS_ENV: "deployment"}
    assert dummy_weights_env(model, "auto") == {}
    assert dummy_weights_env(str(ROOT / "configs/models/deepseek-v3-shape"), "dummy") == {}


@pytest.mark.parametrize("name", FP8_CONFIGS)
def test_fp8_configs_are_the_released_quantization(name):
    """The per-GPU configs carry the released checkpoints' quantization_config and attention shape: DeepSeek-V3's 61
    layers (3 dense) and MTP layer at 16 or 128 heads, Kimi-K2's 41 of 61 layers (1 dense, no MTP) at 8 or 64."""
    cfg = json.loads((ROOT / "configs/models" / name / "config.json").read_text())
    assert cfg["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": [128, 128]}
    layers = (cfg["num_hidden_layers"], cfg["first_k_dense_replace"], cfg.get("num_nextn_predict_layers", 0))
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["q_lora_rank"]) == (512, 64, 1536)
    if name.startswith("deepseek-v3"):
        assert layers == (61, 3, 1) and cfg["num_attention_heads"] in (16, 128)
    else:
        assert layers == (41, 1, 0) and cfg["num_attention_heads"] in (8, 64)


@pytest.mark.parametrize("name", FP8_CONFIGS)
def test_per_gpu_top1_configs_serve_on_the_gpu_release(name):
    """The per-GPU configs route each token to 1 of a GPU's experts; on SGLang 0.5.17 that needs routed scaling 1.0
    (harness.server.top1_moe_refusal), or the MoE returns a buffer it never wrote."""
    from harness.server import top1_moe_refusal

    cfg = json.loads((ROOT / "configs/models" / name / "config.json").read_text())
    assert cfg["num_experts_per_tok"] == 1 and top1_moe_refusal(str(ROOT / "configs/models" / name), "0.5.17") is None


def test_top1_moe_with_a_routed_scale_is_refused_on_0_5_17_only(tmp_path):
    from harness.server import top1_moe_refusal

    cfg = json.loads((ROOT / "configs/models/deepseek-v3-fp8-tp8/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "routed_scaling_factor": 2.5}))
    refused = top1_moe_refusal(str(tmp_path), "0.5.17")
    assert "routed_scaling_factor 2.5" in refused and "set routed_scaling_factor to 1.0" in refused
    assert top1_moe_refusal(str(tmp_path), "0.5.23") is None  # that release routes the factor through its buffer
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8}))
    assert top1_moe_refusal(str(tmp_path), "0.5.17") is None  # top-8 reduces through the buffer: the released shape
    assert top1_moe_refusal(str(ROOT / "configs/models/deepseek-v3-shape"), "0.5.17") is None  # BF16, top-4


def test_the_harness_refuses_such_a_config_before_it_starts_a_server(tmp_path, monkeypatch):
    import harness.server as hs
    from sglang_snapmla import sglang_release

    cfg = json.loads((ROOT / "configs/models/kimi-k2-fp8-tp8/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "routed_scaling_factor": 2.827}))
    monkeypatch.setattr(sglang_release, "installed", lambda: "0.5.17")
    monkeypatch.setattr(hs.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    with pytest.raises(ValueError, match="routed_scaling_factor 2.827"):
        hs.start_server(str(tmp_path), 1, [], tmp_path / "log")
