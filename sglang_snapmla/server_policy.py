"""The server setups snapmla serves, and SGLang's server-args steps that apply them: one clear error per setup it
cannot serve (raised while SGLang resolves its server args, before any memory is allocated), whether server args
select snapmla, the decode graph size its pool calls for, what `plugin.register` found missing in the installed SGLang,
and the steps `plugin` wraps around SGLang's (`SERVER_ARGS_STEPS`, wired per release by `sglang_release`): the "no
accelerator" error translated, the decode graphs grown, page size 64 declared after the setup's checks.
"""

from __future__ import annotations

import functools
import logging
import math
import sys

from . import sglang_release as release


BACKEND = "snapmla"
logger = logging.getLogger("sglang_snapmla.plugin")  # the logger name a server's log shows for the plugin
NO_GPU = ("--attention-backend snapmla serves on NVIDIA GPUs (CUDA; the tuned decode needs sm_90, H100/H200) and this "
          "machine has none. Start the server on a CUDA machine; the test suite (pytest) runs on a CPU.")


class SnapMLAConfigError(ValueError, RuntimeError):
    """A server setup snapmla cannot serve; the message names the fix. Raised while SGLang resolves its server args,
    before any memory is allocated. Uncaught at the top of a command (`python -m sglang.launch_server`,
    `sglang serve`) it prints as one line, not as a traceback through SGLang's argument code."""


def print_config_errors_as_one_line() -> None:
    """Uncaught SnapMLAConfigError at the top of a command: one line on stderr, not a traceback."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if isinstance(value, SnapMLAConfigError):
            print(f"sglang-snapmla: {value}", file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook


def _attention_backends(args) -> set:
    """The attention backends server args (or a resolved view of them) name for any phase."""
    return {getattr(args, "attention_backend", None), getattr(args, "decode_attention_backend", None),
            getattr(args, "prefill_attention_backend", None)} - {None}


def is_selected(args) -> bool:
    """Whether server args select snapmla for any attention phase."""
    return BACKEND in _attention_backends(args)


def snapmla_decode_graph_max_bs(default_max_bs: int) -> int:
    """The largest decode batch to capture when SGLang's default would capture `default_max_bs`: that default grown by
    the tokens a pool of the same bytes holds (1152 / 644 ~ 1.79x), in SGLang's capture steps of 32."""
    from .layout import BF16_BYTES_PER_TOKEN, BYTES_PER_TOKEN

    return 32 * math.ceil(default_max_bs * BF16_BYTES_PER_TOKEN / BYTES_PER_TOKEN / 32)


def _check_hierarchical_cache(args) -> None:
    """HiCache settings the snapmla host pool (host_pool.py) serves; one clear error each."""
    from . import host_pool_settings as hp

    for flag, value, allowed in (("--hicache-mem-layout", getattr(args, "hicache_mem_layout", None), hp.LAYOUTS),
                                 ("--hicache-io-backend", getattr(args, "hicache_io_backend", None), hp.IO_BACKENDS)):
        if value is not None and value not in allowed:
            raise SnapMLAConfigError(f"{flag} {value} is not supported with --attention-backend snapmla; use one of "
                                     f"{', '.join(allowed)}.")
    storage = getattr(args, "hicache_storage_backend", None)
    if storage is not None and storage not in hp.STORAGE_BACKENDS:
        raise SnapMLAConfigError(
            f"--hicache-storage-backend {storage} is not supported with --attention-backend snapmla (its pages are "
            f"644-byte records that only the {', '.join(hp.STORAGE_BACKENDS)} backend is verified to store); use "
            f"--hicache-storage-backend {' or '.join(hp.STORAGE_BACKENDS)}, or none (host memory only).")


def check_server_args(args) -> int:
    """One clear error per unsupported setup; returns the page size to use (64)."""
    phases = _attention_backends(args)
    if phases != {BACKEND}:
        raise SnapMLAConfigError(
            f"snapmla's KV pool is only readable by snapmla: got attention backends {sorted(phases)}. "
            "Use --attention-backend snapmla alone (no other --prefill/--decode-attention-backend).")
    kv_dtype = getattr(args, "kv_cache_dtype", None)
    if kv_dtype not in (None, "auto", "fp8_e4m3"):
        raise SnapMLAConfigError(
            f"--attention-backend snapmla stores its own KV layout (FP8 e4m3 content, one fp32 scale per "
            f"token, BF16 RoPE): got --kv-cache-dtype {kv_dtype}. Drop the flag or pass fp8_e4m3.")
    if getattr(args, "enable_hierarchical_cache", False):
        _check_hierarchical_cache(args)
    problems = _unsupported_setups(args)
    if problems:
        raise SnapMLAConfigError("\n".join(problems))
    draft = getattr(args, "speculative_draft_attention_backend", None)
    if draft not in (None, BACKEND):
        raise SnapMLAConfigError(
            f"snapmla's KV pool is only readable by snapmla, and the MTP draft model gets one too: got "
            f"--speculative-draft-attention-backend {draft}. Drop that flag (the draft then uses snapmla).")
    from .pool import check_pool_config

    device = getattr(args, "device", None) or "cuda"
    config = _model_config(args)
    kv_lora_rank, rope = int(config.kv_lora_rank), int(getattr(config, "qk_rope_head_dim", 0))
    try:
        check_pool_config(kv_lora_rank, rope, 64, "cuda" if device == "auto" else device)
    except ValueError as e:
        raise SnapMLAConfigError(str(e)) from None
    dtype = getattr(args, "dtype", None) or "auto"
    model_dtype = str(getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "")
    if dtype in ("float16", "half") or (dtype == "auto" and model_dtype.endswith("float16")
                                        and not model_dtype.endswith("bfloat16")):
        raise SnapMLAConfigError(
            f"--attention-backend snapmla runs the model in bfloat16 (its kernels take bf16 queries and "
            f"keys); got --dtype {dtype} (model dtype {model_dtype or 'unknown'}). Pass --dtype bfloat16.")
    # SGLang resolves an unset page size to 1 before this pass: only an explicit other size is worth a warning
    if getattr(args, "page_size", None) not in (None, 1, 64):
        logger.warning("--attention-backend snapmla stores the KV cache in 64-token pages: page size %s -> 64",
                       args.page_size)
    return 64


# Speculative decoding: the MTP draft (NEXTN / EAGLE with DeepSeek's MLA draft layer) and a linear draft window
# (topk 1) are what the backend's target verify and draft extend implement.
SUPPORTED_SPECULATIVE = (None, "NEXTN", "EAGLE")


def _unsupported_setups(args) -> list[str]:
    """One message per server option that assumes SGLang's own 576-wide MLA pool or a kernel snapmla lacks."""
    out = []
    if (getattr(args, "dcp_size", 1) or 1) > 1:
        out.append(f"--dcp-size {args.dcp_size} (decode context parallelism) is not supported with --attention-backend "
                   "snapmla: it splits SGLang's 576-wide MLA pool across ranks. Drop --dcp-size.")
    if getattr(args, "disaggregation_decode_enable_offload_kvcache", False):
        out.append("--disaggregation-decode-enable-offload-kvcache is not supported with --attention-backend snapmla: "
                   "the host offload copies one 576-wide array per layer, snapmla's pool holds three. Drop the flag.")
    if getattr(args, "disaggregation_mode", "null") not in (None, "null") and (getattr(args, "pp_size", 1) or 1) > 1:
        out.append("PD disaggregation with --pp-size > 1 is not supported with --attention-backend snapmla (its "
                   "pipeline-stage transfer assumes SGLang's MLA pool). Use --pp-size 1 on PD servers.")
    if getattr(args, "flashinfer_mla_disable_ragged", False):
        out.append("--flashinfer-mla-disable-ragged is not supported with --attention-backend snapmla: its prefill "
                   "reads the cached prefix through fetch-dequant into FlashInfer's ragged kernel, and the paged "
                   "path would read a 576-wide BF16 pool. Drop the flag.")
    if getattr(args, "enable_unified_memory", False):  # SGLang 0.5.23
        out.append("--enable-unified-memory is not supported with --attention-backend snapmla: the unified pool holds "
                   "SGLang's own layout and translates page reads through KV location plans, snapmla's pool holds "
                   "three arrays per layer read through req_to_token. Drop the flag.")
    if getattr(args, "enable_kv_cache_sharding", False):  # SGLang 0.5.23
        out.append("--enable-kv-cache-sharding is not supported with --attention-backend snapmla: it stripes SGLang's "
                   "576-wide MLA pool across ranks. Drop the flag.")
    algo = getattr(args, "speculative_algorithm", None)
    if algo not in SUPPORTED_SPECULATIVE:
        out.append(f"--speculative-algorithm {algo} is not supported with --attention-backend snapmla: its draft "
                   "model is not an MLA model that can read snapmla's pool. Use NEXTN (DeepSeek's MTP layer).")
    topk = getattr(args, "speculative_eagle_topk", None)
    if algo is not None and topk not in (None, 1):
        out.append(f"--speculative-eagle-topk {topk} is not supported with --attention-backend snapmla: its verify "
                   "attends causally over a linear draft window. Pass --speculative-eagle-topk 1.")
    return out


def _model_config(args):
    """The model's (text) config; a clear error for non-MLA models."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    model_path = getattr(args, "model_path", None)
    config = get_config(model_path, trust_remote_code=bool(getattr(args, "trust_remote_code", False)),
                        revision=getattr(args, "revision", None))
    config = getattr(config, "text_config", None) or config
    if getattr(config, "kv_lora_rank", None) is None:
        raise SnapMLAConfigError(f"--attention-backend snapmla serves MLA models (DeepSeek-V2/V3/R1, LongCat-Flash); "
                         f"{model_path} ({getattr(config, 'model_type', '?')}) has no kv_lora_rank. "
                         "Use another --attention-backend for it.")
    return config


# -- the plugin's integration, as `plugin.register` found it -----------------------------------------------
# What `register()` found missing in the installed SGLang (`integration_errors`); the server-args pass and the backend
# factory raise on it where snapmla is selected
integration_errors_found: list[str] = []


def integration_failure() -> str:
    """The one-line refusal for `integration_errors_found`: the first (the release, where that is the cause), and how
    many more the log holds."""
    more = len(integration_errors_found) - 1
    return ("--attention-backend snapmla cannot run on this SGLang: " + integration_errors_found[0]
            + (f" ({more} more integration errors logged above)" if more else ""))


def check_integration() -> None:
    if integration_errors_found:
        raise SnapMLAConfigError(integration_failure())


# -- SGLang's server-args steps, wrapped where snapmla is selected (`sglang_release` wires them per release) ----
def _no_accelerator_step(server_args, previous):
    """Around SGLang's missing-default-values step, which resolves --device: on a machine without an accelerator
    SGLang stops there with a generic RuntimeError at the end of a long traceback. Where snapmla is selected, say what
    it needs."""
    try:
        return previous(server_args)
    except RuntimeError as e:
        if "No accelerator" in str(e) and is_selected(server_args):
            raise SnapMLAConfigError(NO_GPU) from None
        raise


def _graph_size_step(server_args, previous):
    """Around SGLang's GPU-memory-settings step (defaults for chunked prefill, the decode graph sizes and the memory
    fraction): where snapmla is selected and the user set no decode graph size, run it again with the decode graph
    size of `snapmla_decode_graph_max_bs`, so that SGLang's capture list and its memory reserve for the graphs (and
    the memory fraction, unless the user set one) follow the larger size. Wired on 0.5.17 only (`sglang_release`)."""
    if (not is_selected(server_args) or _decode_graph_size_set_by_user(server_args)
            or getattr(server_args, "device", "cuda") != "cuda"):  # no CUDA graphs to size (--device cpu)
        return previous(server_args)
    if getattr(server_args, "enable_dp_attention", False):
        # SGLang reserves max_bs x dp_size x 4.5 MB for DP-attention graphs: 928 at DP 8 would take ~15 GB per GPU
        # from the pool (memory fraction 0.59 -> 0.40 on an H100); each rank's batch is a DP share of the requests
        logger.info("snapmla: decode CUDA graphs at SGLang's default size with DP attention; %s sets another",
                    release.DECODE_GRAPH_SIZE_FLAG)
        return previous(server_args)
    fraction_unset = server_args.mem_fraction_static is None
    result = previous(server_args)
    decode = server_args.cuda_graph_config.decode
    if not decode.max_bs or decode.backend == "disabled":
        return result
    default = decode.max_bs
    decode.max_bs, decode.bs = snapmla_decode_graph_max_bs(default), None
    if fraction_unset:
        server_args.mem_fraction_static = None
    result = previous(server_args)
    logger.info("snapmla: decode CUDA graphs up to batch %d (SGLang's default for a BF16 pool: %d); "
                "%s sets another size", decode.max_bs, default, release.DECODE_GRAPH_SIZE_FLAG)
    return result


def _decode_graph_size_set_by_user(server_args) -> bool:
    """Whether a flag or --cuda-graph-config fixed the decode graph sizes (SGLang records them as locked)."""
    locked = getattr(server_args, "_cuda_graph_config_locked", None)
    if locked is None:
        raise RuntimeError("--attention-backend snapmla: SGLang's server args have no _cuda_graph_config_locked (the "
                           f"decode graph flags this plugin reads); pip install sglang=={release.GPU_VERIFIED}")
    return any(phase == "decode" and key in ("max_bs", "bs") for phase, key in locked)


def _page_size_step(server_args, previous):
    """After SGLang's step at the page-size slot (`sglang_release`): check the setup and declare snapmla's page size,
    through SGLang's own post-process mechanism (server args are read-only; declarations are applied at the end of
    resolution)."""
    from sglang.srt.arg_groups.overrides import run_post_process_pass

    result = previous(server_args)
    run_post_process_pass(server_args, snapmla_server_args_pass)
    if is_selected(server_args) and not release.grows_decode_graphs():
        log_default_graph_size()
    return result


@functools.lru_cache(maxsize=1)
def log_default_graph_size() -> None:
    """Where the plugin's larger decode graphs do not apply (`sglang_release`), once per process (cached:
    `log_default_graph_size.cache_clear()` lets it log again)."""
    logger.info("snapmla: decode CUDA graphs at SGLang's default size on SGLang %s (the plugin grows them on %s "
                "only); %s sets another", release.installed(), release.GPU_VERIFIED, release.DECODE_GRAPH_SIZE_FLAG)


SERVER_ARGS_STEPS = {"handle_missing_default_values": _no_accelerator_step,
                     "handle_gpu_memory_settings": _graph_size_step, "page_size": _page_size_step}


def snapmla_server_args_pass(view) -> dict:
    """Post-process pass: nothing unless snapmla is selected; else the plugin's integration, the setup
    (`server_policy.check_server_args`), and page size 64 declared."""
    if not is_selected(view):
        return {}
    check_integration()
    return {"page_size": check_server_args(view)}
