"""Registration of `--attention-backend snapmla` with SGLang (entry point group `sglang.srt.plugins`); the releases
it runs on and what differs between them are in `sglang_release`.

SGLang calls `register()` in every process (the CLI before argument parsing, `Engine`, each scheduler subprocess);
`python -m sglang.launch_server` also loads plugins before it parses arguments (0.5.17 and 0.5.23), so both entry points
accept `--attention-backend snapmla` (tests/product/test_plugin.py runs both). Only `sglang serve --help` prints its
choices before loading plugins, so its help text omits snapmla; `python -m sglang.launch_server --help` lists it.
Registration is idempotent and changes nothing for other backends: every hook checks that snapmla is the selected
backend before acting. The one exception is asked for by name: `SNAPMLA_DUMMY_WEIGHTS=deployment` makes
`--load-format dummy` of a block-FP8 config draw weights as a deployment's for every backend (`dummy_weights`), so
that the baselines of a comparison load the same model.

What is registered:
* the `--attention-backend` choice, the backend factory, the chunked-prefix-cache capability;
* DeepSeek/LongCat model side: a dispatch handler (MLA vs MHA prefill per batch, as FlashMLA's), the absorbed-decode
  list (so q_nope / q_rope / k_nope / k_rope arrive split) and MHA one-shot support;
* the KV pool: `KVCacheConfigurator._build_mla_kv_pool` builds `SnapMLATokenToKVPool`, and
  `calculate_mla_kv_cache_dim` budgets 644 bytes per token and layer (so the memory planner sizes the pool right);
* MTP (NEXTN/EAGLE) draft backends: SGLang picks them from hard-coded maps (`speculative/draft_utils.py`), so the
  factory's two methods are wrapped to build SnapMLA's (the multi-step draft decode and the draft extend) when
  snapmla is selected;
* decode CUDA graphs for the larger batches the pool admits: where the user sets no decode graph size, SGLang's
  default (256 on an H100 at TP < 4, sized for a BF16 pool) grows by the pool's token ratio, 1152 / 644
  (`snapmla_decode_graph_max_bs`), before SGLang reserves memory for the graphs; batches above the largest captured
  graph decode eagerly at about half the rate. Not with DP attention, where SGLang's reserve for the graphs grows
  with the DP size;
* request validation: where snapmla serves, `TokenizerManager._validate_one_request` also refuses token ids outside
  the vocabulary with HTTP 400 (`request_checks`; SGLang sends prompt ids to the GPU unchecked), in the main process
  and, with --tokenizer-worker-num > 1, in each tokenizer worker (`tokenizer_workers`: SGLang loads no plugins there);
* the hierarchical cache's host pool: `MLATokenToKVPoolHost.__init__` becomes `host_pool`'s
  644-byte-record pool over a snapmla device pool;
* server-args steps (`server_policy.SERVER_ARGS_STEPS`, wrapped where each release offers it, `sglang_release`): a
  translation of SGLang's "no accelerator" error where snapmla is selected, and a pass at SGLang's page-size slot: page
  size 64, and one clear error per setup `server_policy` refuses (a non-MLA model, kv_lora_rank != 512, rope != 64, a
  non-CUDA device, a --kv-cache-dtype other than auto / fp8_e4m3, HiCache outside what `host_pool` serves, mixing
  snapmla with another backend for prefill, decode or the MTP draft, ...), before any memory is allocated.
"""

from __future__ import annotations

import logging
import math
import sys

import torch

from . import dummy_weights, extend
from . import sglang_release as release
from . import server_policy, settings
from .server_policy import (BACKEND, SERVER_ARGS_STEPS, check_integration, integration_failure, is_selected,
                            print_config_errors_as_one_line)

# What snapmla servers report as their KV cache dtype to PD disaggregation's handshake, which compares only that
# string: a snapmla server and a server with another layout (BF16, or FlashMLA's 576-byte FP8, both of which may
# say "auto" / "fp8_e4m3") then refuse each other instead of transferring bytes the other side misreads.
KV_LAYOUT = "snapmla_fp8_e4m3_644"
logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    """Entry point of the plugin. Safe to call more than once."""
    global _registered
    if _registered:
        return
    from sglang.srt import server_args as sa
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers
    from sglang.srt.models.deepseek_common import utils as deepseek_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _add_once(sa.ATTENTION_BACKEND_CHOICES, BACKEND)
    _add_once(sa.CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS, BACKEND)
    _add_once(handlers.MHA_ONE_SHOT_SUPPORTED_BACKENDS, BACKEND)
    _add_once(deepseek_utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS, BACKEND)
    register_attention_backend(BACKEND)(_create_backend)
    handlers.AttentionBackendRegistry.register(BACKEND, _dispatch_attention_method)
    hooks = {**sglang_hooks(HookType), **release.server_args_hooks(SERVER_ARGS_STEPS, HookType)}
    try:
        settings.check_switches()
    except ValueError as e:  # SGLang's plugin loader would log it and serve without what the switch asked for
        raise SystemExit(f"sglang-snapmla: {e}") from e
    before = {target: resolve(target) for target in hooks}
    for target, (fn, kind) in hooks.items():
        if before[target] is not None:  # a missing target is reported below, not left to fail in apply_hooks
            HookRegistry.register(target, fn, kind)
    HookRegistry.apply_hooks()  # idempotent; load_plugins() applies them too
    found = server_policy.integration_errors_found
    found[:] = integration_errors(before) + release.register_resolution_steps(SERVER_ARGS_STEPS)
    for message in found:
        logger.error("%s", message)
    print_config_errors_as_one_line()
    _registered = True
    if found and selected_on_command_line(sys.argv):
        # Another SGLang release may run none of the hooks that refuse it later (the server-args pass) before it
        # allocates the pool. SGLang's plugin loader logs a plugin's exceptions and goes on; SystemExit stops it.
        raise SystemExit(f"sglang-snapmla: {integration_failure()}")


BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")


def selected_on_command_line(argv: list[str]) -> bool:
    """Whether a server command line (`python -m sglang.launch_server ...`, `sglang serve ...`) selects snapmla for any
    attention phase, read before SGLang parses it."""
    for i, arg in enumerate(argv):
        if any(arg == f"{flag}={BACKEND}" or (arg == flag and argv[i + 1:i + 2] == [BACKEND])
               for flag in BACKEND_FLAGS):
            return True
    return False


def sglang_hooks(HookType) -> dict:
    """The SGLang functions this plugin wraps: target (HookRegistry's dotted name) -> (our hook, its HookType; all
    AROUND: hook(original, *args, **kwargs)). A target that did not change when the hooks were applied is an
    integration point this SGLang release does not have (`integration_errors`). The server-args steps are wired apart,
    per release (`sglang_release.server_args_hooks`)."""
    from .request_checks import HOOKED_VALIDATION

    configurator = "sglang.srt.mem_cache.kv_cache_configurator"
    factory = "sglang.srt.speculative.draft_utils.DraftBackendFactory"
    hooks = {
        HOOKED_VALIDATION: (_validate_request_hook, HookType.AROUND),
        f"{configurator}.calculate_mla_kv_cache_dim": (_kv_cache_dim_hook, HookType.AROUND),
        f"{configurator}.KVCacheConfigurator._build_mla_kv_pool": (_build_pool_hook, HookType.AROUND),
        f"{factory}.create_decode_backend": (_draft_decode_backend_hook, HookType.AROUND),
        f"{factory}.create_draft_extend_backend": (_draft_extend_backend_hook, HookType.AROUND),
    }
    # every backend's dummy load: warns about SGLang's block-FP8 draw, or fixes it where asked (`dummy_weights`)
    hooks[dummy_weights.HOOK_TARGET] = (dummy_weights.dummy_weights_hook, HookType.AROUND)
    hooks[dummy_weights.CHECK_TARGET] = (dummy_weights.load_model_check_hook, HookType.AROUND)
    from .host_pool import adopt_snapmla_device_pool
    from .tokenizer_workers import carry_plugins_to_workers_hook

    hooks["sglang.srt.entrypoints.http_server.write_data_for_multi_tokenizer"] = (carry_plugins_to_workers_hook,
                                                                                HookType.AROUND)

    hooks["sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost.__init__"] = (adopt_snapmla_device_pool,
                                                                                  HookType.AROUND)
    return hooks


def resolve(target: str):
    """The object a dotted SGLang name names now, or None where it does not exist."""
    import pkgutil

    try:
        return pkgutil.resolve_name(target)
    except (ImportError, AttributeError):
        return None


def integration_errors(before: dict) -> list[str]:
    """What keeps the plugin from working with the installed SGLang: another release, or a hook target that is
    missing or was left unwrapped (`before`: target -> the function before the hooks were applied). SGLang's plugin
    loader only logs a plugin's failures, so these are raised where snapmla is selected: by its server-args pass
    (at startup, before any memory is allocated) and by the backend factory."""
    import sglang

    fix = f"sglang-snapmla supports SGLang {' and '.join(release.SUPPORTED)}: {release.install_fix()}"
    out = []
    refused = release.refusal(getattr(sglang, "__version__", "?"))
    if refused:
        out.append(refused)
    for target, original in before.items():
        if original is None or resolve(target) is original:
            out.append(f"the hook on {target} did not apply ({'no such function' if original is None else 'unchanged'})"
                       f"; {fix}.")
    return out


def _add_once(choices: list, name: str) -> None:
    if name not in choices:
        choices.append(name)


def _dispatch_attention_method(attn, forward_batch):
    """DeepSeek/LongCat per-batch choice of MLA vs MHA. A prefill over a cached prefix takes the route the plugin's
    cost model finds cheaper (`extend.prefers_absorbed`, decided once per step in the backend's plan: absorbed MLA for
    few new tokens over a long prefix, MHA prefill with the prefix fetch-dequantized otherwise), not SGLang's rule for
    flashmla (absorbed while the batch's prefixes sum to < 8 192 tokens, whatever the new spans). Captured prefill
    graphs (absorbed, SGLang's choice), servers with the chunked prefix cache disabled, and batches without a prefix
    keep SGLang's method."""
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    method = handlers._handle_attention_backend(attn, forward_batch, BACKEND)
    if (not forward_batch.forward_mode.is_extend_without_speculative() or attn.disable_chunked_prefix_cache
            or _in_captured_prefill()):
        return method
    if _step_backend().extend_plan(forward_batch).absorbed:
        return AttnForwardMethod.MLA
    if method == AttnForwardMethod.MLA:
        if handlers._support_mha_one_shot(attn, forward_batch, BACKEND):
            return AttnForwardMethod.MHA_ONE_SHOT
        return AttnForwardMethod.MHA_CHUNKED_KV
    return method


def _step_backend():
    """The attention backend of the forward in progress (SGLang's forward context, as DeepSeek's own dispatch reads
    it): the SnapMLA backend whose forward-metadata hook planned the step."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    if not hasattr(backend, "extend_plan"):
        raise RuntimeError(f"snapmla: the attention backend of this forward is {type(backend).__name__}, not a SnapMLA "
                           "backend, so no step plan holds its prefill route; this SGLang setup is not one the plugin "
                           "supports (sglang_snapmla.sglang_release)")
    return backend


def _in_captured_prefill() -> bool:
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import is_in_breakable_cuda_graph
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import is_in_tc_piecewise_cuda_graph

    return is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph()


def _create_backend(model_runner):
    from .backend import create_snapmla_backend

    check_integration()
    backend = create_snapmla_backend(model_runner)
    extend.bound_mha_chunk_capacity(model_runner.model_config.hf_config, backend.num_q_heads)
    model_runner.kv_cache_dtype_str = KV_LAYOUT  # read by PD disaggregation's handshake (KV_LAYOUT)
    return backend


# ------------------------------------------------------------------------------------------------------------
# hooks
# ------------------------------------------------------------------------------------------------------------
def snapmla_kv_cache_dim(kv_cache_dtype: torch.dtype) -> int:
    """Elements of `kv_cache_dtype` per token and layer that SGLang's memory planner should budget: 644 bytes."""
    from .layout import BYTES_PER_TOKEN

    return math.ceil(BYTES_PER_TOKEN / torch.empty((), dtype=kv_cache_dtype).element_size())


def _kv_cache_dim_hook(original, *args, **kwargs):
    server_args = release.planner_server_args(kwargs)
    if server_args is not None and is_selected(server_args):
        return snapmla_kv_cache_dim(kwargs["kv_cache_dtype"])
    return original(*args, **kwargs)


def _validate_request_hook(original, manager, obj, input_ids, *args, **kwargs):
    """Around SGLang's per-request validation, whose ValueError the HTTP layer answers with 400: where snapmla
    serves, also the token ids, sampling numbers and top-logprob counts a client sends (`request_checks`), after
    SGLang's own checks (and truncation)."""
    result = original(manager, obj, input_ids, *args, **kwargs)
    if is_selected(manager.server_args):
        from .request_checks import check_request_token_ids, check_sampling_numbers, check_top_logprobs_num

        check_request_token_ids(obj, input_ids, manager.model_config.vocab_size)
        check_sampling_numbers(obj)
        check_top_logprobs_num(obj, manager.model_config.vocab_size)
    return result


def _build_pool_hook(original, configurator, *args, max_total_num_tokens: int, **kwargs):
    if not is_selected(configurator.server_args):
        return original(configurator, *args, max_total_num_tokens=max_total_num_tokens, **kwargs)
    from sglang.srt.runtime_context import get_exec

    from .pool import SnapMLATokenToKVPool

    mc = configurator.model_config
    return SnapMLATokenToKVPool(
        max_total_num_tokens, page_size=configurator.pool_page_size, dtype=configurator.kv_cache_dtype,
        kv_lora_rank=mc.kv_lora_rank, qk_rope_head_dim=mc.qk_rope_head_dim,
        layer_num=configurator.layer_info.num_effective_layers, device=configurator.device,
        enable_memory_saver=get_exec().features.enable_memory_saver,
        start_layer=configurator.layer_info.start_layer, end_layer=configurator.layer_info.end_layer)


def _draft_selects_snapmla(factory) -> bool:
    """Whether a DraftBackendFactory serves snapmla (`sglang_release.draft_factory_server_args`); a factory without
    server args is another backend's business (these hooks must never change what an MTP server with another backend
    does)."""
    args = release.draft_factory_server_args(factory)
    return args is not None and is_selected(args)


def _draft_decode_backend_hook(original, factory, *args, **kwargs):
    """DraftBackendFactory.create_decode_backend: the multi-step draft decode container (none for <= 1 step)."""
    if not _draft_selects_snapmla(factory) or factory.speculative_num_steps <= 1:
        return original(factory, *args, **kwargs)
    from .backend import multi_step_draft_backend_class

    return multi_step_draft_backend_class()(factory.draft_model_runner, factory.topk, factory.speculative_num_steps)


def _draft_extend_backend_hook(original, factory, *args, **kwargs):
    """DraftBackendFactory.create_draft_extend_backend: a SnapMLA backend for the draft model's extend (its KV pool
    is a SnapMLA pool too), wrapped as SGLang wraps every draft-extend backend."""
    if not _draft_selects_snapmla(factory):
        return original(factory, *args, **kwargs)
    from sglang.srt.layers.attention.attention_registry import attn_backend_wrapper_for_draft_extend

    runner = factory.draft_model_runner
    return attn_backend_wrapper_for_draft_extend(runner, _create_backend(runner))
