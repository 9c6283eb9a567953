"""The SGLang plugin on CPU: entry point, argument parsing, clear errors, the KV pool (interpreter) and sizing."""

import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import fake_gpus
from sglang_snapmla import layout, server_policy
from sglang_snapmla import numerics as nx

ROOT = Path(__file__).resolve().parents[2]
V2_LITE = ROOT / "configs/models/deepseek-v2-lite-shape"


@pytest.fixture(scope="module")
def plugin():
    from sglang_snapmla import plugin as p

    p.register()
    return p


def parse(*argv):
    """Server args from a command line, resolved as the server resolves them at start (`sglang_release.resolved`)."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_snapmla.sglang_release import resolved

    return resolved(prepare_server_args(list(argv)))


def test_entry_point_registers_everything(plugin):
    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "snapmla"]
    assert ep.value == "sglang_snapmla.plugin:register"
    from sglang.srt import server_args as sa
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    ep.load()()  # idempotent: a second registration changes nothing
    assert sa.ATTENTION_BACKEND_CHOICES.count("snapmla") == 1
    assert "snapmla" in sa.CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
    assert "snapmla" in ATTENTION_BACKENDS
    assert FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.count("snapmla") == 1
    triton_handler = AttentionBackendRegistry.get_handler("triton")
    assert AttentionBackendRegistry.get_handler("snapmla") is not triton_handler


@pytest.mark.cpu_interpreter
def test_server_args_parse_and_pin_page_size(plugin, monkeypatch):
    said = []
    monkeypatch.setattr(plugin.logger, "info", lambda msg, *a: said.append(msg % a))
    args = parse("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--device", "cpu",
                 "--load-format", "dummy")
    assert args.attention_backend == "snapmla" and args.page_size == 64
    # no CUDA graphs on a CPU: the decode graph size and the memory fraction stay SGLang's, and the log claims no
    # larger graphs
    assert not [m for m in said if "decode CUDA graphs up to batch" in m], said
    other = parse("--model-path", str(V2_LITE), "--attention-backend", "triton", "--device", "cpu",
                  "--load-format", "dummy")
    assert args.cuda_graph_config.decode.max_bs == other.cuda_graph_config.decode.max_bs
    assert args.mem_fraction_static == other.mem_fraction_static
    args = parse("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--device", "cpu",
                 "--kv-cache-dtype", "fp8_e4m3", "--page-size", "16")
    assert args.page_size == 64 and args.kv_cache_dtype == "fp8_e4m3"


def _parse_on_an_h100(monkeypatch, *argv):
    """Server args as SGLang resolves them on an 80 GiB GPU (its defaults depend on the GPU's memory)."""
    import importlib

    for module in ("sglang.srt.server_args", "sglang.srt.arg_groups.memory_hook"):  # 0.5.17, 0.5.23
        try:
            monkeypatch.setattr(importlib.import_module(module), "get_device_memory_capacity",
                                lambda device=None: 80 * 1024)
        except (ImportError, AttributeError):
            pass
    return parse("--model-path", str(V2_LITE), "--load-format", "dummy", "--device", "cuda", *argv)


def test_decode_graphs_cover_the_larger_batches_of_the_pool_unless_the_user_sizes_them(plugin, monkeypatch):
    from sglang_snapmla import sglang_release

    bf16 = _parse_on_an_h100(monkeypatch, "--attention-backend", "flashmla")
    args = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla")
    if not sglang_release.grows_decode_graphs():  # 0.5.23: SGLang's default stays, and the server log says so
        assert args.cuda_graph_config.decode.max_bs == bf16.cuda_graph_config.decode.max_bs
        assert args.mem_fraction_static == bf16.mem_fraction_static
        server_policy.log_default_graph_size.cache_clear()
        said = []
        monkeypatch.setattr(plugin.logger, "info", lambda msg, *a: said.append(msg % a))
        _parse_on_an_h100(monkeypatch, "--attention-backend", "flashmla")
        assert said == []  # another backend's server hears nothing of snapmla's graphs
        _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla")
        _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla")
        assert [m for m in said if "decode CUDA graphs at SGLang's default size on SGLang" in m] == said[:1]  # once
        return
    # SGLang's default on an 80 GiB GPU at TP 1 is 256, sized for a BF16 pool; snapmla's holds 1152 / 644 x the tokens
    assert bf16.cuda_graph_config.decode.max_bs == 256
    from sglang_snapmla.server_policy import snapmla_decode_graph_max_bs

    assert snapmla_decode_graph_max_bs(256) == 480 == args.cuda_graph_config.decode.max_bs
    assert args.cuda_graph_config.decode.bs == bf16.cuda_graph_config.decode.bs + list(range(272, 481, 16))
    # SGLang reserves 2 MB per captured batch size of memory for the graphs: the memory fraction leaves room for them
    assert args.mem_fraction_static == pytest.approx(bf16.mem_fraction_static - (480 - 256) * 2 / (80 * 1024),
                                                     abs=1e-3)
    # what the user sets stays: a graph size, a list of sizes, a memory fraction, graphs off
    sized = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", "--cuda-graph-max-bs", "128")
    assert sized.cuda_graph_config.decode.max_bs == 128 and sized.mem_fraction_static == 0.82
    listed = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", "--cuda-graph-bs-decode", "1", "2", "4")
    assert listed.cuda_graph_config.decode.bs == [1, 2, 4]
    # a prefill graph size is not a decode one: the decode graphs still grow
    prefill = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", "--cuda-graph-max-bs-prefill", "64")
    assert prefill.cuda_graph_config.decode.max_bs == 480
    fixed = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", "--mem-fraction-static", "0.6")
    assert fixed.mem_fraction_static == 0.6 and fixed.cuda_graph_config.decode.max_bs == 480
    off = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", "--disable-cuda-graph")
    assert off.cuda_graph_config.decode.backend == "disabled"
    # no graphs, no memory reserved for larger ones: the pool's fraction is BF16's without graphs
    off_bf16 = _parse_on_an_h100(monkeypatch, "--attention-backend", "flashmla", "--disable-cuda-graph")
    assert off.mem_fraction_static == off_bf16.mem_fraction_static
    assert off.cuda_graph_config.decode.max_bs == off_bf16.cuda_graph_config.decode.max_bs
    # DP attention: SGLang reserves graph memory per DP rank; larger graphs would shrink every rank's pool
    dp = ("--tp", "8", "--dp", "8", "--enable-dp-attention")
    dp_bf16 = _parse_on_an_h100(monkeypatch, "--attention-backend", "flashmla", *dp)
    dp_snap = _parse_on_an_h100(monkeypatch, "--attention-backend", "snapmla", *dp)
    assert dp_snap.cuda_graph_config.decode.max_bs == dp_bf16.cuda_graph_config.decode.max_bs == 512
    assert dp_snap.mem_fraction_static == dp_bf16.mem_fraction_static


def test_the_graph_size_step_stops_where_sglang_records_no_graph_flags(plugin):
    """The step reads which decode graph flags the user set from SGLang's `_cuda_graph_config_locked`; server args
    without it (another SGLang) stop the server with the release to install, rather than growing graphs the user
    sized."""
    from sglang_snapmla.sglang_release import GPU_VERIFIED

    args = SimpleNamespace(attention_backend="snapmla", device="cuda")
    refusal = f"no _cuda_graph_config_locked.*pip install sglang=={re.escape(GPU_VERIFIED)}"
    with pytest.raises(RuntimeError, match=refusal):
        server_policy._graph_size_step(args, lambda sa: pytest.fail("SGLang's step ran"))


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("name", ["deepseek-v2-lite-shape", "deepseek-v3-shape", "longcat-flash-shape", "kimi-k2-shape",
                                  "deepseek-v3-fp8-tp8", "deepseek-v3-fp8-dp-attention", "kimi-k2-fp8-tp8",
                                  "kimi-k2-fp8-dp-attention"])
def test_bundled_configs_are_accepted(plugin, name):
    """Every bundled model config parses with snapmla (LongCat's rope is set to 64, SGLang defaults it to 128)."""
    args = parse("--model-path", str(ROOT / "configs/models" / name), "--attention-backend", "snapmla",
                 "--device", "cpu", "--load-format", "dummy")
    assert args.page_size == 64
    from sglang.srt.utils.hf_transformers_utils import get_config

    cfg = get_config(str(ROOT / "configs/models" / name), trust_remote_code=False)
    assert cfg.kv_lora_rank == 512 and cfg.qk_rope_head_dim == 64
    # SGLang's LongCat layer reads config.rope_parameters["rope_theta"] (it crashed the H100 server when None)
    assert cfg.rope_parameters and cfg.rope_parameters["rope_theta"] > 0


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_mtp_server_args_parse_with_the_bundled_v3_config(plugin, algorithm):
    """MTP with snapmla, named NEXTN or EAGLE (both run DeepSeek's MTP layer as the draft): the bundled V3 config
    carries one NEXTN layer, and the flags that benchmarks/serve_and_bench.py's snapmla-mtp run passes are accepted
    (target verify / draft extend then reach the backend with s_q = the draft tokens)."""
    from harness.server import RUNS

    flags = [algorithm if a == "NEXTN" else a for a in RUNS["snapmla-mtp"]]
    assert algorithm in flags
    args = parse("--model-path", str(ROOT / "configs/models/deepseek-v3-shape"), "--device", "cpu",
                 "--load-format", "dummy", *flags)
    assert args.speculative_algorithm in ("NEXTN", "EAGLE") and args.speculative_num_draft_tokens == 3
    assert args.attention_backend == "snapmla" and args.page_size == 64


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_pd_servers_parse_at_one_pipeline_stage(plugin, mode):
    """A PD pair's servers (tools/gpu_host/pd_transfer.sh) parse with snapmla at --pp-size 1; only PD across pipeline
    stages is refused (test_setups_that_assume_sglangs_pool_fail_at_startup)."""
    args = parse("--model-path", str(V3), "--attention-backend", "snapmla", "--device", "cpu", "--load-format", "dummy",
                 "--disaggregation-mode", mode)
    assert args.disaggregation_mode == mode and args.page_size == 64


@pytest.mark.cpu_interpreter
def test_mtp_draft_backends_are_snapmla(plugin, monkeypatch):
    """SGLang picks MTP draft backends from hard-coded maps (a server with snapmla + NEXTN failed at startup with
    "EAGLE is not supported in decode attention backend snapmla"): the plugin's hooks build SnapMLA's multi-step
    draft decode container and draft-extend backend, and leave other backends to SGLang's own maps."""
    from harness.server import RUNS
    from sglang.srt.speculative import draft_utils

    from sglang_snapmla import backend

    built = []
    monkeypatch.setattr(backend, "multi_step_draft_backend_class",
                        lambda: lambda runner, topk, steps: built.append(("draft decode", runner, topk, steps)))
    monkeypatch.setattr(plugin, "_create_backend", lambda runner: built.append(("draft extend", runner)) or "ours")
    runner = SimpleNamespace(model_config=SimpleNamespace(hf_config=object(), hf_text_config=object()))
    v3 = ("--model-path", str(ROOT / "configs/models/deepseek-v3-shape"), "--device", "cpu", "--load-format", "dummy")
    args = parse(*v3, *RUNS["snapmla-mtp"])
    steps = args.speculative_num_steps
    factory = _draft_factory(args, runner, steps)
    factory.create_decode_backend()
    assert factory.create_draft_extend_backend() == "ours"
    assert built == [("draft decode", runner, 1, steps), ("draft extend", runner)]
    assert _draft_factory(args, runner, 1).create_decode_backend() is None

    other = parse(*v3, *[a if a != "snapmla" else "flashmla" for a in RUNS["snapmla-mtp"]])
    factory = _draft_factory(other, SimpleNamespace(**vars(runner)), steps)
    monkeypatch.setattr(factory, "_create_backend", lambda name, backend_map, template, **kw: sorted(backend_map))
    monkeypatch.setattr(draft_utils, "_assert_draft_needs_no_conv_sidecar", lambda runner: None, raising=False)
    assert "flashmla" in factory.create_decode_backend() and len(built) == 2  # SGLang's own map, untouched


def _hook(plugin, target_suffix: str):
    """The hook the plugin registers on the SGLang function whose dotted name ends with `target_suffix`."""
    from sglang.srt.plugins.hook_registry import HookType

    (fn,) = [fn for target, (fn, _) in plugin.sglang_hooks(HookType).items() if target.endswith(target_suffix)]
    return fn


def _backend_factory():
    """What SGLang's model runner calls for --attention-backend snapmla (its registry, filled by register())."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    return ATTENTION_BACKENDS["snapmla"]


def _draft_factory(args, runner, steps):
    """A DraftBackendFactory as each release builds it: with the server args (0.5.17), or from the draft model runner,
    which holds them (0.5.18 on)."""
    import inspect

    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    if "server_args" in inspect.signature(DraftBackendFactory.__init__).parameters:
        return DraftBackendFactory(args, runner, topk=1, speculative_num_steps=steps)
    runner.server_args, runner.draft_attention_backend = args, None
    return DraftBackendFactory(runner, topk=1, speculative_num_steps=steps)


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("layout", [["--tp", "2"], ["--tp", "2", "--enable-dp-attention", "--dp", "2"]],
                         ids=["tp2", "dp2-attention"])
def test_parallel_layouts_parse_with_the_bundled_v3_config(plugin, layout):
    """The multi-GPU layouts (tools/gpu_host/multi_gpu.sh): tensor parallelism and DP attention parse with snapmla and keep
    its page size; each rank then builds its own pool and backend in its scheduler process (the entry point registers
    there too: test_fresh_process_registers_through_load_plugins)."""
    args = parse("--model-path", str(ROOT / "configs/models/deepseek-v3-shape"), "--attention-backend", "snapmla",
                 "--device", "cpu", "--load-format", "dummy", *layout)
    assert args.attention_backend == "snapmla" and args.page_size == 64 and args.tp_size == 2
    try:  # 0.5.23 resolves --enable-dp-attention --dp N into an attention-DP size
        from sglang.srt.runtime_context import attn_dp_enabled_of, num_dp_ranks_of
    except ImportError:
        attn_dp_enabled_of, num_dp_ranks_of = (lambda a: a.enable_dp_attention), (lambda a: a.dp_size)
    assert attn_dp_enabled_of(args) == ("--enable-dp-attention" in layout)
    assert num_dp_ranks_of(args) == (2 if "--dp" in layout else 1)


@pytest.mark.parametrize("where", ["draft model runner", "nowhere"])
def test_draft_hooks_leave_another_backends_mtp_alone_without_factory_server_args(plugin, where, monkeypatch):
    """SGLang's DraftBackendFactory keeps no server_args from 0.5.18 on: with the plugin installed, MTP with another
    attention backend must still get SGLang's own draft backends (the hooks read the draft runner's server args, or
    stand aside)."""
    args = SimpleNamespace(attention_backend="flashmla", decode_attention_backend=None, prefill_attention_backend=None)
    runner = SimpleNamespace(server_args=args) if where == "draft model runner" else SimpleNamespace()
    factory = SimpleNamespace(draft_model_runner=runner, speculative_num_steps=3, topk=1)
    sglangs_own = object()
    decode_hook, extend_hook = (_hook(plugin, f"DraftBackendFactory.{name}")
                                for name in ("create_decode_backend", "create_draft_extend_backend"))
    assert decode_hook(lambda f: sglangs_own, factory) is sglangs_own
    assert extend_hook(lambda f: sglangs_own, factory) is sglangs_own
    if where == "draft model runner":  # the same factory serving snapmla is recognised from the runner's args
        from sglang_snapmla import backend

        args.attention_backend = "snapmla"
        monkeypatch.setattr(backend, "multi_step_draft_backend_class",
                            lambda: lambda runner, topk, steps: ("snapmla draft decode", runner, topk, steps))
        assert decode_hook(lambda f: sglangs_own, factory) == ("snapmla draft decode", runner, 1, 3)


def test_other_backends_untouched(plugin):
    args = parse("--model-path", str(V2_LITE), "--attention-backend", "triton", "--device", "cpu")
    assert args.page_size == 1


def _config_dir(tmp_path, **changes):
    cfg = json.loads((V2_LITE / "config.json").read_text())
    cfg.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        cfg.pop(k)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


@pytest.mark.parametrize("changes,match", [
    (dict(kv_lora_rank=256), "kv_lora_rank=512"),
    (dict(qk_rope_head_dim=128), "qk_rope_head_dim=64"),
    (dict(architectures=["LlamaForCausalLM"], model_type="llama", kv_lora_rank=None), "serves MLA models"),
])
def test_unsupported_models_fail_clearly(plugin, tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        parse("--model-path", _config_dir(tmp_path, **changes), "--attention-backend", "snapmla", "--device", "cpu")


def test_a_config_whose_text_model_is_mla_is_read_there(plugin, monkeypatch):
    """A multimodal config (an MLA language model under `text_config`) is checked by its text model's shapes."""
    from sglang.srt.utils import hf_transformers_utils

    text = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, model_type="deepseek_v3")
    monkeypatch.setattr(hf_transformers_utils, "get_config",
                        lambda *a, **k: SimpleNamespace(model_type="vl", text_config=text))
    assert server_policy._model_config(SimpleNamespace(model_path="m")) is text


def test_a_config_with_its_own_code_is_read_with_trust_remote_code(plugin, tmp_path):
    """A checkpoint whose config class ships with it (`auto_map`, as LongCat-Flash's and Kimi-K2's do) is read with the
    server's --trust-remote-code; without the flag transformers refuses to run its code, as it does for SGLang."""
    (tmp_path / "configuration_remote_mla.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class RemoteMLAConfig(PretrainedConfig):\n"
        "    model_type = 'remote_mla'\n\n"
        "    def __init__(self, kv_lora_rank=512, qk_rope_head_dim=64, **kw):\n"
        "        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim\n"
        "        super().__init__(**kw)\n")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "remote_mla", "architectures": ["RemoteMLAForCausalLM"], "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "auto_map": {"AutoConfig": "configuration_remote_mla.RemoteMLAConfig"}}))
    args = SimpleNamespace(model_path=str(tmp_path), attention_backend="snapmla", device="cuda")
    assert server_policy.check_server_args(SimpleNamespace(**vars(args), trust_remote_code=True)) == 64
    with pytest.raises(ValueError, match="custom code"):
        server_policy.check_server_args(SimpleNamespace(**vars(args), trust_remote_code=False))


def test_non_cuda_device_and_mixed_backends_fail_clearly(plugin, monkeypatch):
    with pytest.raises(ValueError, match="only readable by snapmla"):
        parse("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--prefill-attention-backend",
              "flashinfer", "--device", "cpu")
    # snapmla named for one phase only selects it too: SGLang's default for the other phase could not read its pool
    with pytest.raises(ValueError, match="only readable by snapmla"):
        parse("--model-path", str(V2_LITE), "--decode-attention-backend", "snapmla", "--device", "cpu")
    from sglang.srt import server_args as sa

    # snapmla's layout is its own: every other cache dtype of this release is refused, not silently ignored
    choices = next(a.choices for a in _server_arg_actions(sa) if "--kv-cache-dtype" in a.option_strings)
    others = [c for c in choices if c not in ("auto", "fp8_e4m3")]
    assert "fp8_e5m2" in others and len(others) >= 2, choices
    for dtype in ("fp8_e5m2", "bf16"):  # through SGLang's parsing
        with pytest.raises(ValueError, match=f"--kv-cache-dtype {dtype}. Drop the flag"):
            parse("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--kv-cache-dtype", dtype,
                  "--device", "cpu")
    for dtype in others:  # the policy itself (some SGLang refuses first off Blackwell or off CUDA)
        args = SimpleNamespace(attention_backend="snapmla", kv_cache_dtype=dtype)
        with pytest.raises(server_policy.SnapMLAConfigError, match=f"--kv-cache-dtype {dtype}. Drop the flag"):
            server_policy.check_server_args(args)
    hicache = ("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--enable-hierarchical-cache",
               "--device", "cpu")
    assert parse(*hicache).enable_hierarchical_cache  # both releases (host_pool adopts either's host pool)
    with pytest.raises(ValueError, match="--hicache-storage-backend mooncake is not supported.*use "
                                         "--hicache-storage-backend file"):
        parse(*hicache, "--hicache-storage-backend", "mooncake")
    with pytest.raises(ValueError, match="--hicache-mem-layout page_head is not supported"):
        parse(*hicache, "--hicache-mem-layout", "page_head")
    with pytest.raises(ValueError, match="speculative-draft-attention-backend flashmla"):
        parse("--model-path", str(ROOT / "configs/models/deepseek-v3-shape"), "--attention-backend", "snapmla",
              "--speculative-algorithm", "NEXTN", "--speculative-draft-attention-backend", "flashmla", "--device", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # outside the interpreter, a CPU device cannot run the kernels
    with pytest.raises(ValueError, match="runs on CUDA GPUs"):
        parse("--model-path", str(V2_LITE), "--attention-backend", "snapmla", "--device", "cpu")


def test_a_gpu_without_fp8_is_refused_at_startup(plugin, monkeypatch):
    """An A100 (sm_80) beside an H200: the server-args pass (every visible GPU) and the pool (its own GPU) refuse it by
    name before any memory is allocated; Triton would only fail at the first kernel compile, after the model loaded."""
    from sglang_snapmla.pool import check_pool_config

    args = SimpleNamespace(model_path=str(V2_LITE), attention_backend="snapmla", device="cuda")  # as the pass reads it
    gpus = {0: ((9, 0), "NVIDIA H200"), 1: ((8, 0), "NVIDIA A100-SXM4-80GB")}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fake_gpus(monkeypatch, gpus)
    refusal = r"computes in FP8 e4m3.*capability 8\.9 or newer.*GPU 1 \(NVIDIA A100-SXM4-80GB\) is sm_80"
    with pytest.raises(server_policy.SnapMLAConfigError, match=refusal):
        server_policy.check_server_args(args)
    with pytest.raises(ValueError, match=refusal):
        check_pool_config(512, 64, 64, "cuda:1")
    check_pool_config(512, 64, 64, "cuda:0")
    gpus[1] = ((8, 9), "NVIDIA L40S")
    assert server_policy.check_server_args(args) == 64


V3 = ROOT / "configs/models/deepseek-v3-shape"


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("extra,match", [
    (["--dcp-size", "2", "--tp", "2"], "dcp-size 2"),
    (["--disaggregation-mode", "decode", "--disaggregation-decode-enable-offload-kvcache", "--hicache-storage-backend",
      "file"], "offload-kvcache is not supported"),
    (["--disaggregation-mode", "prefill", "--pp-size", "2"], "pp-size 1 on PD servers"),
    (["--flashinfer-mla-disable-ragged"], "flashinfer-mla-disable-ragged"),
    (["--dtype", "float16"], "--dtype bfloat16"),
    (["--dtype", "half"], "--dtype bfloat16"),
    (["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(V3)], "EAGLE3 is not supported"),
    (["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(V3)], "STANDALONE is not"),
    (["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2", "--speculative-num-steps", "2",
      "--speculative-num-draft-tokens", "4"], "eagle-topk 1"),
    (["--enable-unified-memory"], "enable-unified-memory is not supported"),
    (["--enable-kv-cache-sharding", "--tp", "2"], "enable-kv-cache-sharding is not supported"),
], ids=["dcp", "pd-offload", "pd-pp", "no-ragged", "fp16", "half", "eagle3", "standalone", "tree-draft", "unified-memory",
        "kv-sharding"])
def test_setups_that_assume_sglangs_pool_fail_at_startup(plugin, extra, match):
    """Options whose code paths read SGLang's 576-wide pool or need a kernel snapmla lacks: refused while the
    arguments are parsed, with the fix, before anything is allocated. The unified pool (whose page reads go through
    KV location plans) and KV-cache sharding are options of SGLang 0.5.23."""
    from sglang.srt.server_args import ServerArgs

    if not hasattr(ServerArgs, extra[0].lstrip("-").replace("-", "_")):
        pytest.skip(f"{extra[0]}: not an option of this SGLang release")
    with pytest.raises(ValueError, match=match):
        parse("--model-path", str(V3), "--attention-backend", "snapmla", "--device", "cpu", "--load-format", "dummy",
              *extra)


@pytest.mark.cpu_interpreter
def test_torch_compile_serves_with_snapmla(plugin):
    """--enable-torch-compile is accepted: the backend's forward traces through its typed ops (sglang_snapmla.library;
    test_graph_protocol.py), and a compiled server's outputs were checked against eager ones on a GPU
    (tools/check_torch_compile.py, docs/ACCURACY.md)."""
    args = parse("--model-path", str(V3), "--attention-backend", "snapmla", "--device", "cpu", "--load-format",
                 "dummy", "--enable-torch-compile", "--torch-compile-max-bs", "8")
    assert args.enable_torch_compile and args.attention_backend == "snapmla"


@pytest.mark.cpu_interpreter
def test_a_float16_checkpoint_is_refused_unless_bfloat16_is_asked_for(plugin, tmp_path):
    model = _config_dir(tmp_path, torch_dtype="float16")
    with pytest.raises(ValueError, match="Pass --dtype bfloat16"):
        parse("--model-path", model, "--attention-backend", "snapmla", "--device", "cpu", "--load-format", "dummy")
    args = parse("--model-path", model, "--attention-backend", "snapmla", "--device", "cpu", "--load-format", "dummy",
                 "--dtype", "bfloat16")
    assert args.page_size == 64


def test_another_sglang_or_an_unapplied_hook_stops_the_server(plugin, monkeypatch):
    """SGLang's plugin loader only logs a plugin's exceptions, so a release without one of our integration points
    would start without the pool or the checks: the errors are kept and raised where snapmla is selected."""
    import sglang

    from sglang.srt.plugins.hook_registry import HookType

    target = next(iter(plugin.sglang_hooks(HookType)))
    unchanged = {target: plugin.resolve(target)}  # as if apply_hooks had left it alone
    (message,) = plugin.integration_errors(unchanged)
    assert target in message and "pip install sglang==0.5.23 (or ==0.5.17" in message
    assert "no such function" in plugin.integration_errors({target: None})[0]
    monkeypatch.setattr(sglang, "__version__", "0.5.20")
    assert any("SGLang 0.5.20 is installed" in m for m in plugin.integration_errors({}))
    monkeypatch.setattr(server_policy, "integration_errors_found", [message])
    with pytest.raises(RuntimeError, match="cannot run on this SGLang"):
        server_policy.snapmla_server_args_pass(SimpleNamespace(attention_backend="snapmla"))
    with pytest.raises(RuntimeError, match="cannot run on this SGLang"):
        _backend_factory()(SimpleNamespace())


def test_pd_handshake_sees_snapmlas_own_layout(plugin, monkeypatch):
    """PD disaggregation compares only the KV cache dtype string of the two servers: snapmla reports its layout, which
    no other server can report (every --kv-cache-dtype choice differs), so a mixed pair is refused at the handshake."""
    from sglang.srt import server_args as sa

    from sglang_snapmla import backend

    built = SimpleNamespace(num_q_heads=16)
    monkeypatch.setattr(backend, "create_snapmla_backend", lambda runner: built)
    runner = SimpleNamespace(kv_cache_dtype_str="fp8_e4m3", model_config=SimpleNamespace(hf_config=object()))
    assert _backend_factory()(runner) is built
    assert runner.kv_cache_dtype_str == plugin.KV_LAYOUT
    choices = next(a.choices for a in _server_arg_actions(sa) if "--kv-cache-dtype" in a.option_strings)
    assert plugin.KV_LAYOUT not in choices and "auto" in choices


def _server_arg_actions(sa):
    import argparse

    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    return parser._actions


def _documented_server_commands():
    """(file, argv) of every SGLang server command in the README and docs/DEPLOY.md, continuation lines joined and
    inline code cut at its closing backtick."""
    import shlex

    commands = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "DEPLOY.md"):
        for line in doc.read_text().replace("\\\n", " ").splitlines():
            for program in ("sglang serve ", "python -m sglang.launch_server ", "python3 -m sglang.launch_server "):
                if program in line:
                    tail = line[line.index(program) + len(program):].split("`")[0]
                    commands.append((doc.name, [a for a in shlex.split(tail) if a not in ("...", "--help")]))
    return commands


def test_documented_flags_parse_on_the_installed_release(plugin):
    """Every flag of the documented server commands, and the decode graph flag the plugin's log lines advise, is
    accepted by the installed SGLang's own parser (0.5.23 refuses --cuda-graph-max-bs as ambiguous)."""
    import argparse

    from sglang.srt import server_args as sa

    from sglang_snapmla import sglang_release

    parser = argparse.ArgumentParser(exit_on_error=False)
    sa.ServerArgs.add_cli_args(parser)
    commands = _documented_server_commands()
    assert len(commands) >= 4 and any("--cuda-graph-max-bs-decode" in argv for _, argv in commands), commands
    for doc, argv in commands:
        try:
            _, unknown = parser.parse_known_args(["--model-path", "m", *argv])  # a fragment may leave it out
        except (argparse.ArgumentError, SystemExit) as e:
            pytest.fail(f"{doc}: {' '.join(argv)}: {e}")
        assert not [a for a in unknown if a.startswith("-")], (doc, argv, unknown)
    args = parser.parse_args(["--model-path", "m", sglang_release.DECODE_GRAPH_SIZE_FLAG, "8"])
    assert 8 in [v for k, v in vars(args).items() if "graph_max_bs" in k and "prefill" not in k]


def test_launch_server_module_knows_the_choice():
    """`python -m sglang.launch_server` loads plugins before parsing in 0.5.17: --help lists snapmla."""
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "snapmla" in res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU prints")
@pytest.mark.parametrize("extra, says", [
    ([], "serves on NVIDIA GPUs (CUDA; the tuned decode needs sm_90, H100/H200) and this machine has none"),
    (["--device", "cpu"], "runs on CUDA GPUs (Hopper is the tuned target); got device 'cpu'. Use --device cuda"),
])
def test_a_setup_snapmla_cannot_serve_stops_the_command_with_one_line(extra, says):
    """The README's serve command on a machine without a GPU, and a refused flag: the command stops with the plugin's
    one-line reason and fix, not SGLang's traceback."""
    argv = ["--model-path", str(V2_LITE), "--load-format", "dummy", "--attention-backend", "snapmla", *extra]
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-snapmla: --attention-backend snapmla") and says in last, res.stderr[-2000:]


def test_other_backends_keep_sglangs_own_error_without_a_gpu():
    """The device hook speaks only where snapmla is selected."""
    if torch.cuda.is_available():
        pytest.skip("what a machine without a GPU prints")
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(V2_LITE), "--load-format",
                          "dummy", "--attention-backend", "triton"], capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "No accelerator" in res.stderr and "sglang-snapmla" not in res.stderr


@pytest.mark.parametrize("backend", ["snapmla", "triton"])
def test_another_sglang_release_stops_a_snapmla_command_before_parsing(backend):
    """On a release snapmla does not serve (simulated: SGLang reports 0.5.20), a command line that selects snapmla stops when the plugin loads, before SGLang parses arguments or
    allocates anything, with the plugin's one line; a command line with another backend is not stopped by the plugin.
    The model path does not exist, so any later refusal would come after SGLang's own error about it."""
    script = ("import runpy, sys, sglang\n"
              "sglang.__version__ = '0.5.20'\n"
              "sys.argv = ['launch_server', '--model-path', '/nonexistent/model', '--load-format', 'dummy', "
              f"'--attention-backend', {backend!r}, '--device', 'cpu']\n"
              "runpy.run_module('sglang.launch_server', run_name='__main__')\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    if backend == "snapmla":
        assert last.startswith("sglang-snapmla: --attention-backend snapmla cannot run on this SGLang: SGLang 0.5.20 "
                               "is installed; sglang-snapmla supports SGLang 0.5.17 and 0.5.23: pip install "
                               "sglang==0.5.23 (or ==0.5.17, the release verified on GPUs)."), res.stderr[-2000:]
        assert "Traceback" not in res.stderr and "max_total_num_tokens" not in res.stderr
    else:
        assert "sglang-snapmla: --attention-backend snapmla cannot run" not in res.stderr, res.stderr[-2000:]


def test_command_line_selection():
    from sglang_snapmla.plugin import selected_on_command_line as sel

    assert sel(["x", "--attention-backend", "snapmla"]) and sel(["x", "--decode-attention-backend=snapmla"])
    assert not sel(["x", "--attention-backend", "flashmla"]) and not sel(["x", "--attention-backend"])
    assert not sel(["x", "--model-path", "snapmla"])


def test_sglang_serve_parses_snapmla():
    """`sglang serve` loads plugins before parsing (its --help text does not, so it omits the choice): parse a real
    command line through the CLI, stopping where the server would start."""
    script = (
        "import sys, sglang.launch_server as ls\n"
        "from sglang_snapmla.sglang_release import resolved\n"
        "ls.run_server = lambda a: print('PARSED', resolved(a).attention_backend, resolved(a).page_size)\n"
        "from sglang.cli.main import main\n"
        f"sys.argv = ['sglang', 'serve', '--model-path', {str(V2_LITE)!r}, '--attention-backend', 'snapmla',"
        " '--device', 'cpu', '--load-format', 'dummy']\n"
        "main()\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert "PARSED snapmla 64" in res.stdout, res.stdout[-1000:] + res.stderr[-2000:]


def test_fresh_process_registers_through_load_plugins():
    """Every scheduler subprocess (one per TP rank, per DP rank) calls `load_plugins()` itself: in a fresh
    interpreter that alone must register the backend, its handler, the absorbed-decode list and the pool hooks."""
    script = (
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS\n"
        "from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry\n"
        "from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS\n"
        "import sglang_snapmla.plugin as p\n"
        "print('OK', 'snapmla' in ATTENTION_BACKENDS, 'snapmla' in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS,\n"
        "      AttentionBackendRegistry.get_handler('snapmla') is not AttentionBackendRegistry.get_handler('triton'))\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert "OK True True True" in res.stdout, res.stdout[-1000:] + res.stderr[-2000:]


# ------------------------------------------------------------------------------------------------------------
# pool
# ------------------------------------------------------------------------------------------------------------
# the pool's arguments as SGLang passes them for a DeepSeek-shaped model on the interpreter's device; tests add the
# size and the layers
CPU_POOL = dict(page_size=64, dtype=torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64, device="cpu",
                enable_memory_saver=False)


@pytest.fixture
def pool(plugin):
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    return SnapMLATokenToKVPool(size=256, layer_num=2, **CPU_POOL)


LAYER = SimpleNamespace(layer_id=1)


@pytest.mark.parametrize("change,says", [({"page_size": 16}, "--page-size 64"), ({"page_size": 128}, "--page-size 64"),
                                         ({"kv_lora_rank": 256}, "kv_lora_rank=512"),
                                         ({"qk_rope_head_dim": 32}, "qk_rope_head_dim=64")])
def test_a_pool_the_layout_cannot_hold_is_refused_naming_the_fix(plugin, change, says):
    """Built directly (not through the server's arguments, which pin page size 64), the pool still refuses what the
    644-byte layout and the kernels' 64-token pages cannot hold, saying what to pass instead."""
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    with pytest.raises(ValueError, match=re.escape(says)):
        SnapMLATokenToKVPool(size=256, layer_num=1, **{**CPU_POOL, **change})


@pytest.mark.cpu_interpreter
def test_pool_layout_and_size(pool):
    n = 256 + 64
    kv, scale, rope = pool.snapmla_buffers(1)
    assert kv.shape == (n, 512) and kv.dtype == torch.float8_e4m3fn
    assert scale.shape == (n,) and scale.dtype == torch.float32
    assert rope.shape == (n, 64) and rope.dtype == torch.bfloat16
    assert pool.get_kv_size_bytes() == 2 * n * layout.BYTES_PER_TOKEN
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    assert len(ptrs) == len(lens) == len(items) == 6
    assert sorted(set(items)) == sorted({64 * 512, 64 * 4, 64 * 128})
    with pytest.raises(NotImplementedError, match="three arrays"):
        pool.get_key_buffer(0)


@pytest.mark.cpu_interpreter
def test_pool_set_get_roundtrip_equals_quantize_dequantize(pool, gen):
    T = 70
    nope = (torch.randn(T, 1, 512, generator=gen) * 3).to(torch.bfloat16)
    rope = (torch.randn(T, 1, 64, generator=gen) * 100).to(torch.bfloat16)
    nope[4] = 0
    loc = torch.randperm(255, generator=gen)[:T] + 1
    pool.set_mla_kv_buffer(LAYER, loc, nope, rope)
    got_nope, got_rope = pool.get_mla_kv_buffer(LAYER, loc, torch.bfloat16)
    ref_nope, ref_rope = nx.dequantize_kv(nx.quantize_kv(nope[:, 0], rope[:, 0]))
    assert got_nope.shape == (T, 1, 512) and got_rope.shape == (T, 1, 64)
    assert torch.equal(got_nope[:, 0], ref_nope) and torch.equal(got_rope[:, 0], ref_rope)
    # rows in the dtype the caller asks for (the dequantized fp32 products, rounded once to it)
    wide_nope, wide_rope = pool.get_mla_kv_buffer(LAYER, loc, torch.float32)
    assert wide_nope.dtype == wide_rope.dtype == torch.float32
    assert torch.equal(wide_nope[:, 0], ref_nope.float()) and torch.equal(wide_rope[:, 0], ref_rope.float())
    # the concatenated 576-wide write path stores the same bytes
    loc2 = loc.flip(0)
    pool.set_kv_buffer(LAYER, loc2, torch.cat([nope, rope], -1), None)
    again_nope, again_rope = pool.get_mla_kv_buffer(LAYER, loc2, torch.bfloat16)
    assert torch.equal(again_nope[:, 0], ref_nope) and torch.equal(again_rope[:, 0], ref_rope)


@pytest.mark.cpu_interpreter
def test_pool_move_and_cpu_copy(pool, gen):
    nope = torch.randn(8, 1, 512, generator=gen).to(torch.bfloat16)
    rope = torch.randn(8, 1, 64, generator=gen).to(torch.bfloat16)
    src = torch.arange(1, 9)
    pool.set_mla_kv_buffer(LAYER, src, nope, rope)
    before = pool.get_mla_kv_buffer(LAYER, src)
    tgt = torch.arange(100, 108)
    pool.move_kv_cache(tgt, src)
    moved = pool.get_mla_kv_buffer(LAYER, tgt)
    assert all(torch.equal(a, b) for a, b in zip(before, moved))
    saved = pool.get_cpu_copy(tgt)
    for buf in (*pool.kv_buffer, *pool.kv_scale_buffer, *pool.kv_rope_buffer):
        buf.zero_()
    pool.load_cpu_copy(saved, tgt)
    restored = pool.get_mla_kv_buffer(LAYER, tgt)
    assert all(torch.equal(a, b) for a, b in zip(before, restored))


@pytest.mark.cpu_interpreter
def test_cpu_copy_round_trips_a_request_longer_than_one_offloading_chunk(pool, gen):
    """SGLang offloads a retracted request's cache with get_cpu_copy / load_cpu_copy over its slots in request order,
    in chunks of cpu_offloading_chunk_size (8 192 tokens): a request longer than one chunk, on slots scattered over
    the pool and in both layers, reads back bit-exact, and the other slots keep what they held."""
    pool.cpu_offloading_chunk_size = 3  # 20 tokens: six full chunks and a partial one, as 8 192 does for ~53k
    slots = torch.randperm(255, generator=gen)[:20] + 1
    layers = (SimpleNamespace(layer_id=0), LAYER)
    for layer in layers:
        pool.set_mla_kv_buffer(layer, torch.arange(1, 256), torch.randn(255, 1, 512, generator=gen).to(torch.bfloat16),
                               (torch.randn(255, 1, 64, generator=gen) * 30).to(torch.bfloat16))
    before = [[t.clone() for t in pool.layer_arrays(i)] for i in range(2)]
    saved = pool.get_cpu_copy(slots)
    for buf in (*pool.kv_buffer, *pool.kv_scale_buffer, *pool.kv_rope_buffer):
        buf[slots] = 0
    pool.load_cpu_copy(saved, slots)
    for i in range(2):
        for got, want in zip(pool.layer_arrays(i), before[i]):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), i


@pytest.mark.cpu_interpreter
def test_disaggregation_transfer_reproduces_the_cache(plugin, gen):
    """Copy pages between two pools using only get_contiguous_buf_infos (pointer, length, per-page item size),
    the way a PD-disaggregation transfer engine does; the receiving pool must read back the same cache."""
    import ctypes

    from sglang_snapmla.pool import SnapMLATokenToKVPool

    def make():
        return SnapMLATokenToKVPool(size=64 * 8, layer_num=2, **CPU_POOL)

    src, dst = make(), make()
    src_pages, dst_pages = [3, 5, 1], [7, 2, 4]
    slots = torch.tensor([p * 64 + i for p in src_pages for i in range(64)])
    for layer in (SimpleNamespace(layer_id=0), SimpleNamespace(layer_id=1)):
        src.set_mla_kv_buffer(layer, slots, torch.randn(len(slots), 1, 512, generator=gen).to(torch.bfloat16),
                              (torch.randn(len(slots), 1, 64, generator=gen) * 50).to(torch.bfloat16))
    (sp, sl, si), (dp, dl, di) = src.get_contiguous_buf_infos(), dst.get_contiguous_buf_infos()
    assert sl == dl and si == di
    for s_ptr, d_ptr, item in zip(sp, dp, si):
        for a, b in zip(src_pages, dst_pages):
            ctypes.memmove(d_ptr + b * item, s_ptr + a * item, item)
    dst_slots = torch.tensor([p * 64 + i for p in dst_pages for i in range(64)])
    for layer in (SimpleNamespace(layer_id=0), SimpleNamespace(layer_id=1)):
        got = dst.get_mla_kv_buffer(layer, dst_slots)
        want = src.get_mla_kv_buffer(layer, slots)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    untouched = torch.tensor([6 * 64 + i for i in range(64)])
    assert torch.equal(dst.get_mla_kv_buffer(SimpleNamespace(layer_id=0), untouched)[0],
                       torch.zeros(64, 1, 512, dtype=torch.bfloat16))


def test_sizing_budgets_644_bytes(plugin, monkeypatch):
    """SGLang's memory planner budgets 644 bytes per token and layer for snapmla's pool, called as this release's
    planner calls it: with `server_args` (0.5.17), or without, the process's published server args telling which
    backend serves (0.5.19 on: `sglang_release.planner_server_args`). Another backend keeps SGLang's 576 elements."""
    import inspect

    from sglang.srt import runtime_context
    from sglang.srt.mem_cache import kv_cache_configurator as kcc

    takes_server_args = "server_args" in inspect.signature(kcc.calculate_mla_kv_cache_dim).parameters
    model = SimpleNamespace(hf_config=SimpleNamespace(architectures=["DeepseekV3ForCausalLM"]), kv_lora_rank=512,
                            qk_rope_head_dim=64)
    for backend, dims in (("snapmla", {torch.bfloat16: 322, torch.float8_e4m3fn: 644}),
                          ("flashmla", {torch.bfloat16: 576, torch.float8_e4m3fn: 576})):
        published = SimpleNamespace(attention_backend=backend, dsa_prefill_backend=None, dsa_decode_backend=None)
        monkeypatch.setattr(runtime_context, "get_server_args", lambda: published)
        for dtype, dim in dims.items():
            call = {"server_args": published} if takes_server_args else {}
            assert kcc.calculate_mla_kv_cache_dim(model_config=model, kv_cache_dtype=dtype, **call) == dim
    assert layout.BF16_BYTES_PER_TOKEN / layout.BYTES_PER_TOKEN >= 1.78


@pytest.mark.cpu_interpreter
def test_the_pool_hook_builds_snapmlas_pool_for_snapmla_only(plugin, monkeypatch):
    """SGLang's configurator asks `_build_mla_kv_pool` for the MLA pool: where snapmla serves, the hook builds the
    644-byte pool with the configurator's sizes and its pipeline stage's layers; for another backend, SGLang's own."""
    from sglang.srt import runtime_context

    from sglang_snapmla.pool import SnapMLATokenToKVPool

    monkeypatch.setattr(runtime_context, "get_exec", lambda: SimpleNamespace(
        features=SimpleNamespace(enable_memory_saver=False)))
    sglangs = lambda configurator, *args, **kwargs: "SGLang's pool"  # noqa: E731
    for backend in ("snapmla", "flashmla"):
        configurator = SimpleNamespace(
            server_args=SimpleNamespace(attention_backend=backend), pool_page_size=64, kv_cache_dtype=torch.bfloat16,
            model_config=SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64), device="cpu",
            layer_info=SimpleNamespace(num_effective_layers=2, start_layer=5, end_layer=7))
        pool = plugin._build_pool_hook(sglangs, configurator, max_total_num_tokens=256)
        if backend == "flashmla":
            assert pool == "SGLang's pool"
            continue
        assert isinstance(pool, SnapMLATokenToKVPool) and pool.size == 256 and pool.page_size == 64
        assert (pool.start_layer, pool.end_layer, len(pool.kv_buffer)) == (5, 7, 2)


@pytest.mark.cpu_interpreter
def test_a_pipeline_stage_pool_indexes_its_own_layers(plugin, gen):
    """Under --pp-size > 1 a stage's pool holds layers [start_layer, end_layer): SGLang's layer ids stay global, so
    every accessor translates them. Layers 5 and 6 of a stage that starts at 5, written with different rows, read
    back their own rows, from arrays 0 and 1."""
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    stage = SnapMLATokenToKVPool(size=128, layer_num=2, start_layer=5, end_layer=7, **CPU_POOL)
    loc = torch.randperm(127, generator=gen)[:9] + 1
    rows = {}
    for layer_id in (5, 6):
        nope = torch.randn(9, 1, 512, generator=gen).to(torch.bfloat16)
        rope = torch.randn(9, 1, 64, generator=gen).to(torch.bfloat16)
        stage.set_mla_kv_buffer(SimpleNamespace(layer_id=layer_id), loc, nope, rope)
        rows[layer_id] = nx.dequantize_kv(nx.quantize_kv(nope[:, 0], rope[:, 0]))
    for layer_id in (5, 6):
        got_nope, got_rope = stage.get_mla_kv_buffer(SimpleNamespace(layer_id=layer_id), loc)
        assert torch.equal(got_nope[:, 0], rows[layer_id][0]) and torch.equal(got_rope[:, 0], rows[layer_id][1])
        content, _, _ = stage.snapmla_buffers(layer_id)
        assert content.data_ptr() == stage.kv_buffer[layer_id - 5].data_ptr()
