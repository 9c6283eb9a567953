"""The MHA route's up-projection on block-FP8 weights (sglang_snapmla.extend.bound_mha_chunk_capacity): SGLang's
Triton FP8 GEMM addresses kv_b_proj's [tokens, heads x 256] output with 32-bit offsets, so the plugin keeps SGLang's
MHA chunk capacity below 2^31 output elements wherever the backend is built on block-FP8 weights."""

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_snapmla import extend
from sglang_snapmla.errors import SnapMLAInputError

ROOT = Path(__file__).resolve().parents[2]
ENV = extend.MHA_CHUNK_ENV


def config(name: str) -> SimpleNamespace:
    """A bundled model config as SGLang's hf_config carries it (quantization_config a dict where the file has one)."""
    return SimpleNamespace(**json.loads((ROOT / "configs/models" / name / "config.json").read_text()))


@pytest.mark.parametrize("heads", [8, 16, 32, 64, 128])
def test_the_capacity_is_the_most_whole_pages_below_two_to_the_31_output_elements(heads):
    cap = extend.mha_chunk_capacity(heads)
    assert cap % 64 == 0
    assert cap * heads * 256 < 2**31 <= (cap + 64) * heads * 256
    assert (cap < extend.SGLANG_MHA_CHUNK_DEFAULT) == (heads >= 64)


def test_block_fp8_weights_are_read_from_the_models_quantization_config():
    assert extend.block_fp8_weights(config("deepseek-v3-fp8-dp-attention"))
    assert extend.block_fp8_weights(config("kimi-k2-fp8-tp8"))
    assert not extend.block_fp8_weights(config("deepseek-v3-shape"))
    as_object = SimpleNamespace(quant_method="fp8", weight_block_size=[128, 128])
    assert extend.block_fp8_weights(SimpleNamespace(quantization_config=as_object))
    int8 = {"quant_method": "w8a8_int8", "weight_block_size": [128, 128]}  # block-scaled, but not SGLang's FP8 GEMM
    assert not extend.block_fp8_weights(SimpleNamespace(quantization_config=int8))
    per_tensor = {"quant_method": "fp8", "activation_scheme": "dynamic"}  # FP8 weights with one scale per tensor
    assert not extend.block_fp8_weights(SimpleNamespace(quantization_config=per_tensor))


def test_unset_it_is_bounded_where_sglangs_default_is_above_the_capacity(caplog):
    env = {}
    with caplog.at_level(logging.WARNING, logger="sglang_snapmla.extend"):
        assert extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-dp-attention"), 128, env) == 65472
    assert env == {ENV: "65472"} and "SGLANG_MAX_KV_CHUNK_CAPACITY=65472" in caplog.text
    assert extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-dp-attention"), 128, env) == 65472  # again: kept
    env = {}
    assert extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-tp8"), 16, env) == extend.SGLANG_MHA_CHUNK_DEFAULT
    assert env == {}  # 16 heads: SGLang's default stays
    assert extend.bound_mha_chunk_capacity(config("deepseek-v3-shape"), 128, env) is None and env == {}  # BF16


def test_a_users_value_above_the_capacity_is_refused_with_the_fix_and_one_below_is_kept():
    with pytest.raises(SnapMLAInputError, match=f"{ENV}=100000 is above 65472 .* set {ENV}=65472 or lower"):
        extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-dp-attention"), 128, {ENV: "100000"})
    env = {ENV: "32768"}
    assert extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-dp-attention"), 128, env) == 32768
    assert env == {ENV: "32768"}


def test_the_refusal_starts_one_token_above_the_capacity():
    """At 128 heads 65 536 tokens (64 Ki, a value a user picks) make kv_b_proj's output exactly 2^31 elements, one
    past what the GEMM addresses: refused; the capacity itself, 65 472, is kept."""
    fp8 = config("deepseek-v3-fp8-dp-attention")
    for value in ("65536", "65473"):
        with pytest.raises(SnapMLAInputError, match=f"{ENV}={value} is above 65472"):
            extend.bound_mha_chunk_capacity(fp8, 128, {ENV: value})
    assert extend.bound_mha_chunk_capacity(fp8, 128, {ENV: "65472"}) == 65472


def test_the_plugin_bounds_it_where_it_builds_the_backend(monkeypatch):
    """`plugin._create_backend`, SGLang's factory for `--attention-backend snapmla`, bounds the capacity from the
    model's config and the backend's heads per GPU, in the process that builds it."""
    import os

    from sglang_snapmla import backend, plugin

    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv(ENV)  # recorded, so that the value the plugin sets is undone after the test
    monkeypatch.setattr(plugin, "check_integration", lambda: None)
    monkeypatch.setattr(backend, "create_snapmla_backend", lambda runner: SimpleNamespace(num_q_heads=128))
    runner = SimpleNamespace(model_config=SimpleNamespace(hf_config=config("deepseek-v3-fp8-dp-attention")))
    assert plugin._create_backend(runner).num_q_heads == 128
    assert os.environ[ENV] == "65472"


def test_sglangs_prefill_dispatch_reads_the_bound_the_plugin_sets(monkeypatch):
    """The bound acts only if SGLang reads the variable when it dispatches a prefill, not once at import: after the
    plugin sets it, the chunk capacity SGLang's ForwardBatch reports (its one-shot / chunked MHA choice and the prefix
    chunks' size) is the bound."""
    import os

    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv(ENV)  # recorded, so that the value set below is undone after the test
    assert envs.SGLANG_MAX_KV_CHUNK_CAPACITY.get() == extend.SGLANG_MHA_CHUNK_DEFAULT
    extend.bound_mha_chunk_capacity(config("deepseek-v3-fp8-dp-attention"), 128, os.environ)
    assert ForwardBatch.get_max_chunk_capacity(SimpleNamespace()) == extend.mha_chunk_capacity(128) == 65472
