"""The SGLang releases the plugin runs on, and the one place that knows what moved between them.

| what the plugin needs | SGLang 0.5.17 | SGLang 0.5.23 | moved in |
|---|---|---|---|
| wrap a server-args step (missing defaults, GPU memory settings) | `ServerArgs._handle_*` methods, through `HookRegistry` | named steps of `arg_groups/pipeline.py`, through `arg_groups.resolution_hooks.register_resolution_hook` | 0.5.19-0.5.20 |
| declare page size 64 before SGLang's default (1) | after `ServerArgs._handle_page_size` | after the `handle_attention_backend_compatibility` step (the page-size default pass runs after it and keeps a declared size) | 0.5.20 |
| grow the default decode graph size (`server_policy._graph_size_step`) | re-runs the step with a larger size | not applied: the step declares into the resolution record, which a second run cannot redo; SGLang's default size stays (logged once) | 0.5.20 |
| `calculate_mla_kv_cache_dim` (the memory planner's bytes per token) | takes `server_args` | no `server_args`: the plugin reads the published ones (`runtime_context.get_server_args`) | 0.5.19 |
| `DraftBackendFactory` | holds `server_args` | built from the draft model runner (`draft_model_runner.server_args`) | 0.5.18 |
| FlashMLA page-table metadata (the SnapMLA backend's parent) | from `req_to_token` | from KV location plans (`forward_batch.kv_loc_plan`, `model_runner.kv_index_translator`) where reads are translated, else from `req_to_token` as before; reads are translated only with `--enable-unified-memory`, which the plugin refuses (with `--enable-kv-cache-sharding`) | 0.5.22 |
| what SGLang builds the HiCache host pool from (`MLATokenToKVPoolHost.__init__`, adopted by `host_pool`) | the device pool | `buffer_info` of the device pool's `get_device_pool_infos()` (an MLABufferInfo of one 576-wide tensor per layer; the snapmla pool gives `pool.SnapMLAHostRecords`) | 0.5.18-0.5.23 |
| FlashMLA's tile schedule, which the SnapMLA backend answers with placeholders (`backend.skip_flashmla_schedule`) | `get_mla_metadata` of `flashmla_backend`'s namespace (from `sgl_kernel.flash_mla`) | the same name (from `flash_mla_interface`) | - |
| the decode graph size flag the plugin's messages and docs print (`DECODE_GRAPH_SIZE_FLAG`) | `--cuda-graph-max-bs-decode` (`--cuda-graph-max-bs` also parses; it sizes prefill graphs too) | `--cuda-graph-max-bs-decode` (`--cuda-graph-max-bs` is refused as an ambiguous prefix of the per-phase flags) | after 0.5.17 (the releases between are not installed here) |
| FlashMLA through `sgl_kernel.flash_mla` | at import of SGLang's backend | through SGLang's `kernels/ops/attention/flash_mla_interface.py` over the `flash_mla` wheel (needs libcuda at import) | 0.5.23 |

Both releases serve (`SUPPORTED`). 0.5.17 is verified on Hopper GPUs; 0.5.23 needs torch 2.14, which the GPU hosts do
not have, so on 0.5.23 the backend is verified on the CPU only: SGLang's attention kits, its CUDA-graph capture and
replay metadata protocol (tests/product/test_graph_protocol.py) and the server-args, sizing and draft-factory tests.

Releases 0.5.18-0.5.22 are refused: 0.5.18-0.5.19 need torch 2.13 and have neither hook set checked here, and
0.5.20-0.5.22 pin `cuda-tile==1.6.0rc5`, an sdist that cannot be installed without reaching outside the package
index, so no test of ours has run on them.
"""

from __future__ import annotations

from typing import Callable

# The releases a snapmla server starts on (CPU tests run on both); the GPU hosts run 0.5.17, the only one their
# torch 2.11 can run
SUPPORTED = ("0.5.17", "0.5.23")
GPU_VERIFIED = "0.5.17"

# The flag that sizes the largest decode CUDA graph, spelled so that every supported release parses it (see the table)
DECODE_GRAPH_SIZE_FLAG = "--cuda-graph-max-bs-decode"

# A server-args step of ours: fn(server_args, previous) where previous(server_args) runs SGLang's own step.
Step = Callable[[object, Callable[[object], None]], object]

# step name -> the 0.5.17 ServerArgs method it wraps (0.5.23 names the step itself in register_resolution_hook)
_SERVER_ARGS_METHODS = {
    "handle_missing_default_values": "_handle_missing_default_values",
    "handle_gpu_memory_settings": "_handle_gpu_memory_settings",
    "page_size": "_handle_page_size",
}
# where page size is declared on releases with named resolution steps (see the table)
_PAGE_SIZE_STEP = "handle_attention_backend_compatibility"


def install_fix() -> str:
    """The pip command that puts a supported release in place."""
    return f"pip install sglang=={SUPPORTED[-1]} (or =={GPU_VERIFIED}, the release verified on GPUs)"


def refusal(version: str) -> str | None:
    """Why a snapmla server cannot start on SGLang `version`, naming the fix; None where it serves."""
    if version in SUPPORTED:
        return None
    return f"SGLang {version} is installed; sglang-snapmla supports SGLang {' and '.join(SUPPORTED)}: {install_fix()}."


def installed() -> str:
    import sglang

    return getattr(sglang, "__version__", "?")


def has_resolution_hooks() -> bool:
    """Whether server args are resolved by named steps that plugins wrap (0.5.20 on) instead of ServerArgs methods."""
    try:
        from sglang.srt.arg_groups import resolution_hooks  # noqa: F401
    except ImportError:
        return False
    return True


def server_args_hooks(steps: dict[str, Step], HookType) -> dict:
    """For releases with ServerArgs methods: HookRegistry target -> (AROUND hook, HookType.AROUND) running `steps`
    (name -> Step) around the methods. The methods' extra arguments (0.5.17's `_handle_gpu_memory_settings(gpu_mem)`)
    are passed through to SGLang's step."""
    if has_resolution_hooks():
        return {}
    out = {}
    for name, step in steps.items():
        def around(original, server_args, *args, _step=step, **kwargs):
            return _step(server_args, lambda sa: original(sa, *args, **kwargs))
        out[f"sglang.srt.server_args.ServerArgs.{_SERVER_ARGS_METHODS[name]}"] = (around, HookType.AROUND)
    return out


def register_resolution_steps(steps: dict[str, Step]) -> list[str]:
    """For releases with named resolution steps: register `steps` there -> the integration errors (a step name the
    release does not accept). The decode graph growth is left out (see the table)."""
    if not has_resolution_hooks():
        return []
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    errors = []
    for name, step in steps.items():
        if name == "handle_gpu_memory_settings":
            continue
        target = _PAGE_SIZE_STEP if name == "page_size" else name
        try:
            register_resolution_hook(target)(step)
        except ValueError as e:
            errors.append(f"the resolution step {target} cannot be wrapped on SGLang {installed()}: {e}")
    return errors


def grows_decode_graphs() -> bool:
    """Whether the plugin's larger default decode graph size applies on this release (see the table)."""
    return not has_resolution_hooks()


def planner_server_args(kwargs: dict):
    """The server args behind a `calculate_mla_kv_cache_dim` call: its `server_args` keyword (0.5.17), else the ones
    published for this process (0.5.19 on); None before they are published."""
    if kwargs.get("server_args") is not None:
        return kwargs["server_args"]
    from sglang.srt import runtime_context

    try:
        return runtime_context.get_server_args()
    except (ValueError, AttributeError, RuntimeError):
        return None


def draft_factory_server_args(factory):
    """A DraftBackendFactory's server args: its own (0.5.17) or its draft model runner's (0.5.18 on); None if neither."""
    return getattr(factory, "server_args", None) or getattr(getattr(factory, "draft_model_runner", None),
                                                            "server_args", None)


def resolved(server_args):
    """Server args as SGLang resolved them. 0.5.17 resolves while it builds them (`ServerArgs.__post_init__`); from
    0.5.20 on resolution is its own step (`ServerArgs.resolve_once`, run by the server at start) whose results are read
    through a view, the record itself keeping what the user passed."""
    if not hasattr(server_args, "resolve_once"):
        return server_args
    from sglang.srt.arg_groups.overrides import resolved_view

    server_args.resolve_once()
    return resolved_view(server_args)
