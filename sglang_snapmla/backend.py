"""The SnapMLA attention backend for SGLang.

Subclass of SGLang's FlashMLA backend: it reuses its page-table metadata (64-token pages, CUDA-graph buffers,
target-verify / draft-extend handling for MTP) and its parent's MHA prefill paths, and replaces every kernel that
reads the cache:

* decode, target verify, draft extend: fused Q-quant + SnapMLA split-KV decode + combine (`ops`), s_q = 1 or the
  number of draft tokens;
* MHA prefill (prefills without a cached prefix, and those with one where the plugin's route model says MHA is
  cheaper, `extend.prefers_absorbed`): FlashInfer's ragged path; the prefix comes from the pool's fetch-dequant;
* absorbed-MLA extend (prefills in SGLang's captured prefill graphs, up to 2 048 tokens; those over a cached prefix
  the route model sends here; all with the chunked prefix cache disabled): the decode kernel with s_q = each
  request's new tokens (causal among them), requests of similar span batched into one launch.
KV writes go through the pool's fused K-append kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from typing import Optional

import torch

from . import decode_plan, extend, library, settings
from . import ops
from .layout import KV_LORA_RANK, ROPE_DIM
from .pool import SnapMLATokenToKVPool

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """A decode, target verify or draft extend step as each of its layers runs it (`SnapMLAForward.plan_step`).

    decode: the kernels' plan for [B, s_q, heads] queries; block_table [B, P] int32: FlashMLA's block table (under
    CUDA graphs a view of its static buffer); seq_lens [B] int32: keys per sequence, the step's new tokens included."""
    decode: decode_plan.DecodePlan
    block_table: torch.Tensor
    seq_lens: torch.Tensor


@dataclasses.dataclass
class ExtendPlan:
    """A prefill step (extend or mixed) as each of its layers runs it (`SnapMLAForward.plan_step`).

    lengths: (new tokens per request, keys per request), the batch's `extend_seq_lens_cpu` and `seq_lens_cpu`;
    absorbed: the route of a batch over a cached prefix (`extend.prefers_absorbed`), which the plugin's dispatch
    handler applies to every layer; req_pool_indices [B]: each request's row of req_to_token, the batch's own tensor;
    requests_version: that tensor's version counter when the plan was made (an in-place write, as into a static
    buffer, moves it); launches: per head count, the absorbed-MLA launches and their decode plans, made with the plan
    where the route is absorbed, else at the step's first layer that runs absorbed MLA (SGLang's choice; a batch the
    route sends to MHA needs none), and read by the step's other layers. A layer's batch is this plan's when
    `fits` (the lengths and the very requests)."""
    lengths: tuple
    absorbed: bool
    req_pool_indices: torch.Tensor
    requests_version: Optional[int]
    launches: dict = dataclasses.field(default_factory=dict)

    def fits(self, forward_batch) -> bool:
        """Whether `forward_batch` is the batch this plan was made for: the same lengths and the same requests. The
        requests are compared as the req_pool_indices tensor object and its version counter (no device sync): a new
        batch carries a new tensor, and one written in place (a reused or static buffer) a new version. Tensors made
        under torch.inference_mode (SGLANG_ENABLE_TORCH_INFERENCE_MODE=1) keep no version counter; for them the
        object and the lengths are compared."""
        rows = forward_batch.req_pool_indices
        return (rows is self.req_pool_indices and _version(rows) == self.requests_version
                and _extend_lengths(forward_batch) == self.lengths)


def _version(t: torch.Tensor) -> Optional[int]:
    """A tensor's version counter (moved by every in-place write), None for an inference tensor (it keeps none)."""
    return None if t.is_inference() else t._version


def _extend_lengths(forward_batch) -> tuple:
    return tuple(forward_batch.extend_seq_lens_cpu), tuple(forward_batch.seq_lens_cpu.tolist())


@functools.lru_cache(maxsize=1)
def _log_extend_replanned() -> None:
    logger.warning("snapmla: a prefill layer got a batch that its step's plan does not cover (no prefill plan, or one "
                   "for other requests or lengths: the forward metadata was not built for this batch, or on another "
                   "view of it); the step is planned again from the layer's batch (logged once)")


class SnapMLAForward:
    """The forward paths of the backend. Reads `token_to_kv_pool`, `req_to_token`, `forward_metadata`
    (FlashMLA's block table), `num_q_heads`, `num_draft_tokens` and `max_pages`, which FlashMLABackend / our __init__
    set (and, for `unread_schedule`, FlashMLA's static schedule buffers); decode-like steps run the plan that
    `plan_step` made from them.
    Kept apart from the SGLang base class so it imports (and is tested) on machines without sgl_kernel's GPU ops."""

    # -- shared by decode, target verify and draft extend ------------------------------------------------------
    def _save(self, layer, loc, k, k_rope, save_kv_cache: bool):
        if not save_kv_cache or k is None:
            return
        if k_rope is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, loc, k, k_rope)
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, None)

    def _split_q(self, q, q_rope, layer):
        """-> q_nope [T, H, 512], q_rope [T, H, 64] (views) from the absorbed split form or the concatenated one."""
        heads = layer.tp_q_head_num
        if q_rope is not None:
            return q.view(-1, heads, KV_LORA_RANK), q_rope.view(-1, heads, ROPE_DIM)
        q = q.view(-1, heads, KV_LORA_RANK + ROPE_DIM)
        return q[..., : KV_LORA_RANK], q[..., KV_LORA_RANK:]

    def _attend(self, q_nope, q_rope, layer, block_table, seq_lens, plan: decode_plan.DecodePlan):
        """Q-quant + decode over the pool for [B * s_q] query tokens (`plan`'s shape; with `plan.q_in_decode` the
        decode quantizes Q itself), with a block table and int32 lengths `ops.check_decode_step` accepted for the
        plan; returns [B * s_q, H * 512]."""
        self._log_q_layout(q_nope)
        out, _ = library.quantize_and_decode(q_nope, q_rope, *self.token_to_kv_pool.snapmla_buffers(layer.layer_id),
                                             block_table, seq_lens, layer.scaling, plan)
        return out.view(-1, layer.tp_q_head_num * KV_LORA_RANK)

    q_layouts_logged: frozenset = frozenset()  # the kinds of q_nope layout `_log_q_layout` has logged

    def _log_q_layout(self, q_nope) -> None:
        """Log each kind of q_nope [T, H, 512] layout once per backend: contiguous; head-major as SGLang's absorbed
        BMM writes it ([H, T, 512] transposed); or head-major with more rows per head than tokens, as DeepGEMM's masked
        GEMM writes it under SGL_USE_DEEPGEMM_BMM=1 (rows aligned to 256: a graph captured at a batch of 256 shows it
        only at the next size). All run (`library.quantize_and_decode` reads strides); the lines say which ones a
        server met."""
        tokens, heads, width = q_nope.shape
        stride = tuple(q_nope.stride())
        token_stride, head_stride, unit = stride
        if tokens == 1:  # a lone token's stride is whatever SGLang's last view made it: the heads' stride decides
            token_stride = heads * width if head_stride == width else width
        rows = head_stride // width
        if (token_stride, head_stride, unit) == (heads * width, width, 1):
            kind, layout = "contiguous", "contiguous"
        elif token_stride == width and unit == 1 and rows == tokens:
            kind, layout = "head-major", "head-major (the absorbed BMM's [heads, tokens, 512], transposed)"
        elif token_stride == width and unit == 1:
            kind = "head-major, padded"
            layout = (f"head-major, padded: {rows} rows per head for {tokens} token{'s' * (tokens != 1)} "
                      "(DeepGEMM's masked GEMM)")
        else:
            kind = layout = f"strides {stride}"
        if kind in self.q_layouts_logged:
            return
        self.q_layouts_logged = self.q_layouts_logged | {kind}
        logger.info("snapmla: q_nope [tokens, heads, 512] arrives %s", layout)

    step_plan: Optional[StepPlan | ExtendPlan] = None  # the plan of the step that `plan_step` saw last
    # (step kind, batch) -> the StepPlan a CUDA graph of that kind and batch was captured with; None before
    # init_cuda_graph_state
    graph_step_plans: Optional[dict] = None

    def plan_step(self, forward_batch, graph_seq_lens: Optional[torch.Tensor] = None, replay: bool = False) -> None:
        """Plan a step for all of its layers from the batch and FlashMLA's metadata for it (the caller has just built
        that). A decode, target verify or draft extend step: the split count from the static page bound
        (`max_pages`), not from the block table, whose width under CUDA graphs is that of the view SGLang captured
        with; the int32 lengths; the step's checks. A prefill step: its route (`ExtendPlan`). Any other batch clears
        the plan.
        `graph_seq_lens`: under CUDA graphs (capture and every replay), a static int32 buffer of at least B entries,
        which the lengths are written into here, outside the graph, for the captured kernels to read; eager steps
        cast them to a new tensor.
        `replay`: a graph replay. Only the lengths are written: the plan is the one this kind and batch was captured
        with, over the same static buffers, since no layer code runs in a replay (the plan and its checks cost ~10 us
        of host time a step, docs/DESIGN.md "Per-step metadata"); with SNAPMLA_CHECK_INDICES=1 the step is planned
        and checked again, the checks reading the replayed table."""
        mode = forward_batch.forward_mode
        if mode.is_target_verify() or mode.is_draft_extend_v2():
            s_q = self.num_draft_tokens
        elif mode.is_decode_or_idle():
            s_q = 1
        elif mode.is_extend_without_speculative():
            self.step_plan = self._plan_extend(forward_batch)
            return
        else:
            self.step_plan = None
            return
        bs = forward_batch.batch_size
        if mode.is_draft_extend_v2():  # FlashMLA's window-aligned int32 lengths (a static buffer under graphs)
            seq_lens = self.forward_metadata.seq_lens_k[:bs]
        else:
            seq_lens = forward_batch.seq_lens[:bs]
            if mode.is_target_verify():  # the draft tokens follow the committed ones
                seq_lens = seq_lens + s_q
            seq_lens = graph_seq_lens[:bs].copy_(seq_lens) if graph_seq_lens is not None else seq_lens.to(torch.int32)
        kind = (mode.is_target_verify(), mode.is_draft_extend_v2(), bs)
        captured = self.graph_step_plans.get(kind) if replay and self.graph_step_plans is not None else None
        if (captured is not None and not settings.index_checks_enabled()
                and captured.seq_lens.data_ptr() == seq_lens.data_ptr()
                and captured.block_table.data_ptr() == self.forward_metadata.block_kv_indices.data_ptr()):
            self.step_plan = captured
            return
        plan = decode_plan.plan_decode(bs, s_q, self.num_q_heads, self.max_pages, seq_lens.device)
        block_table = self.forward_metadata.block_kv_indices[:bs]
        ops.check_decode_step(block_table, seq_lens, plan, self.token_to_kv_pool.num_slots)
        self.step_plan = StepPlan(plan, block_table, seq_lens)
        if graph_seq_lens is not None and self.graph_step_plans is not None and not replay:
            self.graph_step_plans[kind] = self.step_plan

    def _plan_extend(self, forward_batch) -> ExtendPlan:
        """The route, and where it is absorbed MLA (then every layer of the step runs it), the launches too."""
        extend_lens, seq_lens = _extend_lengths(forward_batch)
        prefix_lens = [t - e for t, e in zip(seq_lens, extend_lens)]
        rows = forward_batch.req_pool_indices
        plan = ExtendPlan((extend_lens, seq_lens), extend.prefers_absorbed(prefix_lens, list(extend_lens),
                                                                           self.num_q_heads), rows, _version(rows))
        if plan.absorbed:
            self._plan_launches(plan, self.num_q_heads, plan.req_pool_indices.device)
        return plan

    def _plan_launches(self, plan: ExtendPlan, heads: int, device) -> list:
        """The absorbed-MLA launches of `plan`'s batch with their decode plans, checked, kept in the plan per head
        count. Eager (prefill outside CUDA graphs): each launch's decode is planned from its own longest sequence."""
        if heads not in plan.launches:
            extend_lens, seq_lens = plan.lengths
            launches = extend.plan_absorbed_launches(list(extend_lens), list(seq_lens), plan.req_pool_indices,
                                                     self.req_to_token)
            planned = [(launch, decode_plan.plan_decode(launch.seq_lens.shape[0], launch.s_q, heads,
                                                        launch.max_pages, device))
                       for launch in launches]
            for launch, decode in planned:
                ops.check_decode_step(launch.block_table, launch.seq_lens, decode, self.token_to_kv_pool.num_slots)
            plan.launches[heads] = planned
        return plan.launches[heads]

    def extend_plan(self, forward_batch) -> ExtendPlan:
        """The step's prefill plan for a layer's batch: the one `plan_step` made, or, where the layer's batch is not the
        one it was made for (`ExtendPlan.fits`: other requests or lengths; forward metadata not built for this batch,
        or built on another view of it), a new one for it (logged once)."""
        plan = self.step_plan
        if not isinstance(plan, ExtendPlan) or not plan.fits(forward_batch):
            _log_extend_replanned()
            plan = self.step_plan = self._plan_extend(forward_batch)
        return plan

    skips_flashmla_schedule = True  # False: SNAPMLA_FLASHMLA_SCHEDULE=1, FlashMLA's schedule computed (measurements)
    unread_schedules = 0  # how many FlashMLA tile schedules this backend has not computed
    _empty_schedule = None

    def unread_schedule(self, batch: int, graphed: bool):
        """What FlashMLA's metadata code gets instead of `get_mla_metadata(lengths [batch], ...)`: (tile schedule
        [n, 8], splits [batch + 1]) int32, never read. `graphed` (CUDA-graph metadata): the first row of its static
        schedule buffer and the first batch + 1 entries of its static splits buffer, which it copies into themselves;
        eager: empty tensors (stored in its metadata only)."""
        if graphed:
            return self.cuda_graph_mla_metadata[:1], self.cuda_graph_num_splits[: batch + 1]
        if self._empty_schedule is None:
            empty = torch.empty(0, dtype=torch.int32, device=self.req_to_token.device)
            self._empty_schedule = (empty.view(0, 8), empty)
        return self._empty_schedule

    def _decode_batch(self, q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope, s_q: int):
        """Write the new K, then attend with s_q query tokens per sequence as the step's plan says."""
        step, shape = self.step_plan, [forward_batch.batch_size, s_q, layer.tp_q_head_num]
        planned = [step.decode.batch, step.decode.s_q, step.decode.heads] if isinstance(step, StepPlan) else None
        if planned != shape:
            raise RuntimeError(f"snapmla: this step's [batch, s_q, heads] is {shape} but its plan is for {planned}: "
                               "the backend's forward metadata (init_forward_metadata or "
                               "init_forward_metadata_out_graph) was not built for it")
        self._save(layer, forward_batch.out_cache_loc, k, k_rope, save_kv_cache)
        q_nope, q_rope = self._split_q(q, q_rope, layer)
        return self._attend(q_nope, q_rope, layer, step.block_table, step.seq_lens, step.decode)

    # -- SGLang entry points ------------------------------------------------------------------------------
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True,
                       q_rope: Optional[torch.Tensor] = None, k_rope: Optional[torch.Tensor] = None, **kwargs):
        return self._decode_batch(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope, s_q=1)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True,
                       q_rope: Optional[torch.Tensor] = None, k_rope: Optional[torch.Tensor] = None, **kwargs):
        mode = forward_batch.forward_mode
        if mode.is_target_verify() or mode.is_draft_extend_v2():
            return self._decode_batch(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope,
                                      s_q=self.num_draft_tokens)
        if q_rope is None and layer.head_dim != KV_LORA_RANK + ROPE_DIM:
            # MHA prefill (ragged, one-shot or chunked prefix; a layer of the model's head dim, e.g. 192): FlashInfer's
            # path; the prefix comes from pool.get_mla_kv_buffer, i.e. fetch-dequant (as FlashMLABackend's). The
            # absorbed MQA layer (head dim 576 = latent + RoPE) goes below, its q split or concatenated.
            from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

            return FlashInferMLAAttnBackend.forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache)
        return self._absorbed_extend(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope)

    def _absorbed_extend(self, q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope):
        """Extend through absorbed MLA: each request's new tokens are s_q query tokens of the decode kernel (causal
        among them) over prefix + new tokens in the pool; requests of similar span share a launch
        (`extend.plan_absorbed_launches`, planned once per step). Rows of q past the batch's tokens (a padded
        prefill-graph bucket) are left unwritten."""
        self._save(layer, forward_batch.out_cache_loc, k, k_rope, save_kv_cache)
        q_nope, q_rope = self._split_q(q, q_rope, layer)
        heads = layer.tp_q_head_num
        out = q_nope.new_empty(q_nope.shape[0], heads * KV_LORA_RANK)
        # the step's launches: planned by its forward-metadata hook where the route is absorbed MLA, else (SGLang's
        # own choice of absorbed MLA: captured prefill, the chunked prefix cache disabled) at its first absorbed layer
        for launch, plan in self._plan_launches(self.extend_plan(forward_batch), heads, q_nope.device):
            attended = self._attend(q_nope.index_select(0, launch.rows), q_rope.index_select(0, launch.rows), layer,
                                    launch.block_table, launch.seq_lens, plan)
            out.index_copy_(0, launch.dst, attended.index_select(0, launch.src))
        return out

# -- FlashMLA's tile schedule, not computed ------------------------------------------------------------------
# FlashMLA's metadata code, which the backend runs for its block table, also builds FlashMLA's own kernel schedule
# with `get_mla_metadata` (a kernel launch and two allocations per step; under CUDA graphs two copies into static
# buffers before every replay), which SnapMLA's kernels never read. While a SnapMLA backend builds its metadata on a
# thread, the module's `get_mla_metadata` returns placeholders instead: under CUDA graphs views of FlashMLA's own
# static buffers (their copies into themselves return at once), in eager steps two empty tensors.
# .owner: (the SnapMLA backend building its forward metadata on this thread, whether it is CUDA-graph metadata)
_building_metadata = threading.local()


def skip_flashmla_schedule(flashmla_backend) -> None:
    """Wrap `flashmla_backend.get_mla_metadata` (SGLang's module; both releases call it by that name) so that it
    returns `SnapMLAForward.unread_schedule` for a SnapMLA backend inside `building_metadata` and calls FlashMLA
    otherwise (other backends, other threads). Idempotent; a release without the name is refused loudly."""
    original = getattr(flashmla_backend, "get_mla_metadata", None)
    if original is None:
        raise RuntimeError("snapmla: SGLang's flashmla_backend module has no get_mla_metadata, which the SnapMLA "
                           "backend replaces while it builds FlashMLA's page-table metadata; this SGLang release is "
                           "not one the plugin supports (sglang_snapmla.sglang_release)")
    if getattr(original, "snapmla_unread_schedule", False):
        return

    @functools.wraps(original)
    def get_mla_metadata(cache_seqlens, *args, **kwargs):
        owner = getattr(_building_metadata, "owner", None)
        if owner is None:
            return original(cache_seqlens, *args, **kwargs)
        backend, graphed = owner
        backend.unread_schedules += 1
        return backend.unread_schedule(cache_seqlens.shape[0], graphed)

    get_mla_metadata.snapmla_unread_schedule = True
    flashmla_backend.get_mla_metadata = get_mla_metadata


@contextlib.contextmanager
def building_metadata(backend, graphed: bool):
    """FlashMLA's metadata code runs in here for `backend`, without FlashMLA's tile schedule (see above)."""
    if not backend.skips_flashmla_schedule:
        yield
        return
    _building_metadata.owner = (backend, graphed)
    try:
        yield
    finally:
        _building_metadata.owner = None


@functools.lru_cache(maxsize=1)
def backend_class() -> type:
    """SnapMLABackend = SnapMLAForward over SGLang's FlashMLABackend (imported here: it needs sgl_kernel's GPU ops)."""
    from sglang.srt.layers.attention import flashmla_backend
    from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend

    skip_flashmla_schedule(flashmla_backend)

    class SnapMLABackend(SnapMLAForward, FlashMLABackend):
        def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, kv_last_page_len_buf=None):
            super().__init__(model_runner, skip_prefill, kv_indptr_buf, kv_last_page_len_buf)
            if not isinstance(self.token_to_kv_pool, SnapMLATokenToKVPool):
                raise RuntimeError(
                    "--attention-backend snapmla needs its KV pool, but this process built "
                    f"{type(self.token_to_kv_pool).__name__}: the sglang_snapmla plugin did not load here "
                    "(check SGLANG_PLUGINS and that sglang-snapmla is installed in this environment)")
            # Static page bound for the split heuristic: the same number at capture and at every replay.
            self.max_pages = decode_plan.static_max_pages(self.max_context_len)
            # The decode implementation resolved (and logged, once) at startup, outside any CUDA graph capture: the
            # prebuilt library's check and the extension's build run here, not inside the first captured decode.
            decode_plan.decode_impl()
            self.snapmla_graph_seq_lens = None
            self.skips_flashmla_schedule = not settings.flashmla_schedule_computed()

        # SGLang's forward-metadata protocol: FlashMLA's metadata (the block table) first, then the step's plan.
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, block_kv_indices=None):
            super().init_cuda_graph_state(max_bs, max_num_tokens, block_kv_indices)
            # the int32 lengths that captured decode-like graphs read, written before every replay (plan_step)
            self.snapmla_graph_seq_lens = torch.ones(max_bs, dtype=torch.int32,
                                                     device=self.cuda_graph_kv_indices.device)
            self.graph_step_plans = {}

        def init_forward_metadata(self, forward_batch):
            with building_metadata(self, graphed=False):
                super().init_forward_metadata(forward_batch)
            self.plan_step(forward_batch)

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
            with building_metadata(self, graphed=True):
                super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
            if self.snapmla_graph_seq_lens is None:
                raise RuntimeError("snapmla: CUDA-graph metadata asked for before init_cuda_graph_state")
            self.plan_step(forward_batch, graph_seq_lens=self.snapmla_graph_seq_lens, replay=not in_capture)

    return SnapMLABackend


@functools.lru_cache(maxsize=1)
def multi_step_draft_backend_class() -> type:
    """SnapMLAMultiStepDraftBackend: FlashMLA's per-step container for MTP draft decoding (one backend per draft step
    but the last, sharing its kv_indptr buffers and metadata handling), with SnapMLA backends in the steps."""
    from sglang.srt.layers.attention.flashmla_backend import FlashMLAMultiStepDraftBackend

    class SnapMLAMultiStepDraftBackend(FlashMLAMultiStepDraftBackend):
        def __init__(self, model_runner, topk: int, speculative_num_steps: int):
            # the parent validates topk, allocates the per-step kv_indptr rows and builds FlashMLA backends, which
            # are replaced here (their construction allocates only small metadata buffers)
            super().__init__(model_runner, topk, speculative_num_steps)
            self.attn_backends = [backend_class()(model_runner, skip_prefill=True, kv_indptr_buf=self.kv_indptr[i],
                                                  kv_last_page_len_buf=None)
                                  for i in range(speculative_num_steps - 1)]

    return SnapMLAMultiStepDraftBackend


def create_snapmla_backend(model_runner):
    """Factory registered under `--attention-backend snapmla`."""
    return backend_class()(model_runner)

