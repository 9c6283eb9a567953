"""The backend under SGLang's CUDA-graph protocol (sglang_graph_protocol.py), on CPU: no launch argument may differ
between the capture-time forward (fill-value lengths, width-1 block-table view) and a forward with the replay
metadata, because a captured graph replays the capture's arguments. Checked for every kernel launch, Triton and the
sm_90a decode (through a stand-in extension), for decode, target verify and draft extend, at one split and many;
the replayed forward's output is checked against the spec (Triton).
The GPU twin (tests/product/test_gpu_graph_protocol.py) captures and replays real CUDA graphs."""

import math
import os

import pytest
import torch

from helpers import assert_close
from sglang_graph_protocol import MODES, GraphProtocol, import_flashmla_backend, zeros_in_layout
from sglang_snapmla import cuda_ext, decode_plan
from sglang_snapmla.kernels.triton import decode as tdecode
from sglang_snapmla.kernels.triton import quant as tquant

pytestmark = pytest.mark.cpu_interpreter


class LaunchLog:
    """Records every launch of the ops' kernels (Triton `kernel[grid](...)` and the CUDA extension's decode_split)."""

    TRITON = ((tquant, "quantize_q_kernel"), (tdecode, "decode_split_kernel"), (tdecode, "combine_kernel"))

    def __init__(self, monkeypatch):
        self.launches = []
        for module, name in self.TRITON:
            kernel = getattr(module, name)
            monkeypatch.setattr(module, name, self._recording(name, kernel))
        log = self

        class StandInExtension:
            def decode_split(self, *args):
                log.launches.append(("cuda.decode_split", None, args, {}))
                for t in args[8:12]:
                    t.zero_()  # defined outputs for the combine

            def decode_split_q_bf16(self, *args):  # the 64-row kernel quantizing Q itself (128 heads)
                log.launches.append(("cuda.decode_split_q_bf16", None, args, {}))
                for t in args[7:11]:
                    t.zero_()

        monkeypatch.setattr(cuda_ext, "load", lambda: StandInExtension())

    def _recording(self, name, kernel):
        log = self

        class Recording:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    log.launches.append((name, tuple(grid), args, kwargs))
                    return kernel[grid](*args, **kwargs)

                return launch

        return Recording()

    def take(self):
        out, self.launches = self.launches, []
        return out


def describe(value, static: set[int]):
    """What a captured graph freezes of one launch argument: a scalar's value; a tensor's dtype, strides and offset,
    and for buffers read in place (pool, block table) its address. The shape is not frozen: no kernel reads it."""
    if isinstance(value, torch.Tensor):
        ptr = value.untyped_storage().data_ptr()
        return ("tensor", value.dtype, value.stride(), value.storage_offset(), ptr if ptr in static else None)
    return value


# (heads, batch, window, one split): with the 8 SMs the interpreter reports, these reach the one-split path (final
# outputs written by the decode) and the split + combine path of both implementations
CASES = [(16, 2, 3, False), (16, 16, 3, True), (128, 1, 2, False), (128, 4, 2, True)]


@pytest.mark.parametrize("impl", ["triton", "cuda", "cuda_q_in_decode"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("heads,bs,window,one_split", CASES)
def test_replay_reuses_every_captured_launch_argument(gen, monkeypatch, heads, bs, window, one_split, mode, impl):
    if impl == "cuda_q_in_decode":  # SNAPMLA_Q_IN_DECODE=1: the 64-row kernel quantizes Q (128 heads)
        if heads != 128:
            pytest.skip("the narrow kernel's cases: the same launches as 'cuda'")
        monkeypatch.setenv("SNAPMLA_Q_IN_DECODE", "1")
        impl = "cuda"
    monkeypatch.setattr(decode_plan, "decode_impl", lambda requested=None: impl)
    if heads == 128:  # the Q-quant in blocks of 8 heads, as at serving batches (here a few tokens reach the floor)
        monkeypatch.setattr(decode_plan, "Q_QUANT_MIN_PROGRAMS", 8)
    lens = [int(x) for x in torch.randint(65, 400, (bs,), generator=gen)]
    lens[0] = 130 + 64 * 3  # many pages: a width-1 capture view covers one of them
    proto = GraphProtocol(heads, max_bs=bs + 2, lens=lens, gen=gen, device="cpu", window=window, max_context_len=1024)
    q, q_rope = proto.queries(mode)
    log = LaunchLog(monkeypatch)
    fb = proto.capture_metadata(mode)
    assert proto.backend.forward_metadata.block_kv_indices.shape[1] == 1  # SGLang's capture view, as in serving
    proto.forward(mode, fb, zeros_in_layout(q), zeros_in_layout(q_rope))
    captured = log.take()
    fb = proto.replay_metadata(mode)
    out = proto.forward(mode, fb, q, q_rope)
    replayed = log.take()
    assert proto.backend.step_plan.decode.impl == impl  # the patch above steers the plan
    static = proto.static_storages()
    names = [launch[0] for launch in captured]
    assert names == [launch[0] for launch in replayed] and any("decode" in n for n in names)
    assert ("combine_kernel" not in names) == one_split, names
    quant_grids = [grid for name, grid, _, _ in captured if name == "quantize_q_kernel"]
    plan = proto.backend.step_plan.decode
    # the 64-row sm_90a kernel quantizes Q itself where asked (more than 32 query rows)
    assert plan.q_in_decode == (os.environ.get("SNAPMLA_Q_IN_DECODE") == "1" and plan.s_q * heads > 32)
    assert ("cuda.decode_split_q_bf16" in names) == plan.q_in_decode and bool(quant_grids) != plan.q_in_decode
    assert all(g[1] == math.ceil(heads / (8 if heads == 128 else 1)) for g in quant_grids), quant_grids
    for (name, grid, args, kwargs), (_, grid2, args2, kwargs2) in zip(captured, replayed):
        assert grid == grid2, f"{name}: grid {grid} at capture, {grid2} at replay"
        assert kwargs == kwargs2, f"{name}: {kwargs} at capture, {kwargs2} at replay"
        for i, (a, b) in enumerate(zip(args, args2)):
            assert describe(a, static) == describe(b, static), \
                f"{name} argument {i}: {describe(a, static)} at capture, {describe(b, static)} at replay"
    for name, _, args, _ in captured:  # the step's block table and lengths: buffers refilled in place at a replay
        if "decode" in name:
            paging = args[5:7] if name == "cuda.decode_split_q_bf16" else args[6:8]
            assert None not in [describe(t, static)[-1] for t in paging], \
                f"{name} reads a block table or lengths made at capture: a replay would read a freed tensor"
    if impl == "triton":
        assert_close(out.float(), proto.reference(mode, q, q_rope), rel_l2=3e-2, what=f"{mode} after replay")


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_traces_the_backends_forward_as_one_graph(gen, mode):
    """SGLang's --enable-torch-compile runs the model's forward, our backend's included, through torch.compile: the
    decode, target-verify and draft-extend forwards (step plan, Q-quant, decode and combine through the typed ops of
    sglang_snapmla.library) trace without a graph break and compute what eager computes, bit for bit (`aot_eager`,
    the Triton interpreter behind the ops)."""
    proto = GraphProtocol(heads=16, max_bs=4, lens=[70, 130, 3], gen=gen, device="cpu")
    q, q_rope = proto.queries(mode)
    fb = proto.replay_metadata(mode)
    eager = proto.forward(mode, fb, q, q_rope)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, q_rope: proto.forward(mode, fb, q, q_rope), fullgraph=True,
                             backend="aot_eager")(q, q_rope)
    assert torch.equal(eager, compiled)
    assert_close(compiled.float(), proto.reference(mode, q, q_rope), rel_l2=3e-2, what=f"compiled {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_flashmla_tile_schedule_is_not_computed(gen, mode):
    """FlashMLA's metadata code, which builds the block table snapmla reads, also builds FlashMLA's own tile schedule
    (`get_mla_metadata`), which snapmla never reads. While a snapmla backend builds its metadata -- eager, at capture
    and at every replay -- the module's `get_mla_metadata` hands back placeholders instead: under graphs views of
    FlashMLA's static buffers, which its copies then copy into themselves. Any other caller gets FlashMLA's schedule;
    SNAPMLA_FLASHMLA_SCHEDULE=1 (the backend's `skips_flashmla_schedule` off) computes it for snapmla too."""
    proto = GraphProtocol(heads=16, max_bs=4, lens=[70, 130, 3], gen=gen, device="cpu")
    be, flashmla_backend = proto.backend, import_flashmla_backend()
    flashmla_schedule = flashmla_backend.get_mla_metadata.__wrapped__
    skipped = be.unread_schedules
    proto.capture_metadata(mode)
    assert be.unread_schedules == skipped + 1, "FlashMLA's schedule computed at capture"
    assert be.forward_metadata.flashmla_metadata.shape == (1, 8)
    # what FlashMLA's code copies into its static buffers: themselves
    placeholders = be.unread_schedule(proto.bs, graphed=True)
    assert [(t.data_ptr(), t.shape) for t in placeholders] == \
        [(be.cuda_graph_mla_metadata.data_ptr(), (1, 8)), (be.cuda_graph_num_splits.data_ptr(), (proto.bs + 1,))]
    proto.replay_metadata(mode)
    assert be.unread_schedules == skipped + 2, "FlashMLA's schedule computed at a replay"
    assert be.step_plan is not None and be.step_plan.decode.batch == proto.bs
    lens = torch.tensor(proto._runner_lens(mode))
    be.init_forward_metadata(proto._forward_batch(mode, lens, lens, torch.arange(1, proto.bs + 1)))
    assert be.unread_schedules == skipped + 3, "FlashMLA's schedule computed in an eager step"
    assert be.forward_metadata.flashmla_metadata.numel() == 0 and be.step_plan.decode.batch == proto.bs
    # another backend's call, outside a snapmla backend's metadata: FlashMLA's own schedule
    lens32 = lens.to(torch.int32)
    theirs, expected = flashmla_backend.get_mla_metadata(lens32, 16, 1), flashmla_schedule(lens32, 16, 1)
    assert [t.shape for t in theirs] == [t.shape for t in expected]
    be.skips_flashmla_schedule = False
    proto.replay_metadata(mode)
    assert be.unread_schedules == skipped + 3
    assert be.forward_metadata.flashmla_metadata.shape == expected[0].shape


@pytest.mark.parametrize("mode", MODES)
def test_a_replay_writes_the_lengths_and_reuses_the_plan_it_was_captured_with(gen, monkeypatch, mode):
    """No layer code runs in a graph replay, so the plan a replay needs is the one its graph was captured with: a
    replay writes the step's lengths into the graph's buffer and neither plans nor checks again (~10 us of host time
    a step); a batch of another kind, or a batch never captured, is planned, and with SNAPMLA_CHECK_INDICES=1 every
    replay is planned and checked again, the checks reading the replayed table."""
    from sglang_snapmla.errors import SnapMLAInputError

    proto = GraphProtocol(heads=16, max_bs=4, lens=[70, 130, 3], gen=gen, device="cpu", window=2)
    be = proto.backend
    proto.capture_metadata(mode)
    captured = be.step_plan
    planned, plan_decode = [], decode_plan.plan_decode
    monkeypatch.setattr(decode_plan, "plan_decode", lambda *a, **k: planned.append(a) or plan_decode(*a, **k))
    proto.replay_metadata(mode)
    assert be.step_plan is captured and planned == []
    if mode != "draft_extend":  # (draft extend reads FlashMLA's own window-aligned lengths buffer)
        assert be.snapmla_graph_seq_lens[:proto.bs].tolist() == proto.kv_lens(mode)
    other = "decode" if mode != "decode" else "target_verify"
    proto.replay_metadata(other)  # never captured: planned for itself
    assert len(planned) == 1 and be.step_plan.decode.s_q == proto.s_q(other)
    proto.replay_metadata(mode)
    assert be.step_plan is captured and len(planned) == 1
    monkeypatch.setenv("SNAPMLA_CHECK_INDICES", "1")
    proto.replay_metadata(mode)
    assert len(planned) == 2 and be.step_plan is not captured
    be.req_to_token[2, :64] += 64 * 10_000  # request 1's first page now lies past the pool
    with pytest.raises(SnapMLAInputError, match="outside the pool"):
        proto.replay_metadata(mode)


@pytest.mark.parametrize("mode", MODES)
def test_each_captured_batch_replays_with_the_plan_of_its_own_batch(gen, monkeypatch, mode):
    """SGLang captures one graph per batch size, largest first, then replays any of them: a replay's plan is the one
    captured for its own batch, whatever was captured, replayed or run eagerly before it (a plan of another batch
    covers other rows of the block table; an eager step's plan reads other lengths and would be planned again)."""
    lens = [70, 130, 3]
    proto = GraphProtocol(heads=16, max_bs=4, lens=lens, gen=gen, device="cpu", window=2)
    be = proto.backend
    captured = {}
    for bs in (3, 2, 1):
        proto.bs, proto.lens = bs, lens[:bs]
        proto.capture_metadata(mode)
        captured[bs] = be.step_plan
    planned, plan_decode = [], decode_plan.plan_decode
    monkeypatch.setattr(decode_plan, "plan_decode", lambda *a, **k: planned.append(a) or plan_decode(*a, **k))
    for bs in (1, 3, 2, 3):
        proto.bs, proto.lens = bs, lens[:bs]
        proto.replay_metadata(mode)
        assert be.step_plan is captured[bs] and be.step_plan.decode.batch == bs
        assert be.step_plan.block_table.shape[0] == bs and planned == []
    proto.eager_metadata(mode)  # a batch above the largest graph, or graphs off for a step: planned for itself
    assert len(planned) == 1 and be.step_plan is not captured[3]
    proto.replay_metadata(mode)
    assert be.step_plan is captured[3] and len(planned) == 1


def test_a_release_without_get_mla_metadata_is_refused():
    from types import SimpleNamespace

    from sglang_snapmla.backend import skip_flashmla_schedule

    with pytest.raises(RuntimeError, match="has no get_mla_metadata"):
        skip_flashmla_schedule(SimpleNamespace())
    module = SimpleNamespace(get_mla_metadata=lambda *a: "flashmla")
    skip_flashmla_schedule(module)
    wrapped = module.get_mla_metadata
    skip_flashmla_schedule(module)  # once per module: the wrapper is not wrapped again
    assert module.get_mla_metadata is wrapped and wrapped(torch.ones(2)) == "flashmla"


def test_mtp_draft_steps_plan_without_flashmlas_schedule(gen):
    """MTP draft decoding runs through FlashMLA's multi-step container (`backend.multi_step_draft_backend_class`),
    which hands each step's snapmla backend a DECODE view of the draft batch (SGLang's `build_inner_fb_view`): under
    graphs and eagerly, every step's backend plans the decode and computes no FlashMLA schedule."""
    from types import SimpleNamespace

    from sglang_snapmla.backend import multi_step_draft_backend_class

    steps = [GraphProtocol(heads=16, max_bs=4, lens=[70, 130, 3], gen=gen, device="cpu") for _ in range(2)]
    container = object.__new__(multi_step_draft_backend_class())
    container.speculative_num_steps, container.topk = len(steps) + 1, 1
    container.attn_backends = [p.backend for p in steps]
    proto = steps[0]
    lens = torch.tensor(proto.lens)
    fb = proto._forward_batch("decode", lens, lens, torch.arange(1, proto.bs + 1))
    fb.spec_info, fb.seq_lens_sum = SimpleNamespace(), int(lens.sum())
    container.init_forward_metadata_out_graph(fb)
    container.init_forward_metadata(fb)
    for p in steps:
        be = p.backend
        assert be.unread_schedules == 2, "a draft step computed FlashMLA's schedule"
        assert be.step_plan is not None and (be.step_plan.decode.batch, be.step_plan.decode.s_q) == (proto.bs, 1)
        assert be.step_plan.seq_lens.tolist() == proto.lens


def _runner_without_a_gpu(monkeypatch):
    """A draft model runner stand-in over a SnapMLA pool, with FlashMLABackend.__init__ (which needs a GPU model
    runner) replaced by one that checks its arguments, keeps its kv_indptr row and sets what SnapMLABackend's own
    __init__ reads (the pool, a context length of 4 096)."""
    from types import SimpleNamespace

    from sglang_snapmla import plugin
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    plugin.register()
    flashmla_backend = import_flashmla_backend()
    pool = SnapMLATokenToKVPool(size=64 * 4, page_size=64, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=1, device="cpu", enable_memory_saver=False)
    runner = SimpleNamespace(kv_index_translator=None, req_to_token_pool=SimpleNamespace(size=4), device="cpu")

    def flashmla_init(self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None):
        assert model_runner is runner and skip_prefill
        self.kv_indptr_buf, self.token_to_kv_pool, self.max_context_len = kv_indptr_buf, pool, 4096

    monkeypatch.setattr(flashmla_backend.FlashMLABackend, "__init__", flashmla_init)
    return runner


def test_the_mtp_draft_container_holds_a_snapmla_backend_per_draft_step_but_the_last(monkeypatch):
    """SGLang runs draft step i through the container's attn_backends[i] for i < steps - 1, each with its own row of
    the container's kv_indptr: the container built for 3 steps holds two SnapMLA backends (none of FlashMLA's left),
    on rows 0 and 1, over the draft runner's SnapMLA pool, with the server's static page bound."""
    from sglang_snapmla.backend import backend_class, multi_step_draft_backend_class

    runner = _runner_without_a_gpu(monkeypatch)  # first: it installs the stand-ins FlashMLA's module imports
    container = multi_step_draft_backend_class()(runner, 1, 3)
    steps = container.attn_backends
    assert [type(b) for b in steps] == [backend_class()] * 2
    assert [b.kv_indptr_buf.data_ptr() for b in steps] == [container.kv_indptr[i].data_ptr() for i in range(2)]
    assert all(b.max_pages == decode_plan.static_max_pages(4096) for b in steps)


def test_a_backend_computes_flashmlas_schedule_only_when_asked(monkeypatch):
    """A new backend skips FlashMLA's tile schedule (its kernels never read it) unless SNAPMLA_FLASHMLA_SCHEDULE=1."""
    from sglang_snapmla.backend import backend_class

    runner = _runner_without_a_gpu(monkeypatch)
    monkeypatch.delenv("SNAPMLA_FLASHMLA_SCHEDULE", raising=False)
    assert backend_class()(runner, skip_prefill=True).skips_flashmla_schedule
    monkeypatch.setenv("SNAPMLA_FLASHMLA_SCHEDULE", "1")
    assert not backend_class()(runner, skip_prefill=True).skips_flashmla_schedule


def test_the_graph_lengths_buffer_holds_the_largest_captured_batch(monkeypatch):
    """init_cuda_graph_state adds to FlashMLA's graph buffers the int32 lengths that every capture and replay writes
    (`plan_step`) and the captured kernels read: max_bs of them, on the device of FlashMLA's block table (whose own
    method allocates on "cuda" by name, so it is stood in for here). CUDA-graph metadata asked for before the graph
    state exists is refused."""
    from sglang_snapmla.backend import backend_class

    flashmla_backend = import_flashmla_backend()

    def flashmla_graph_state(self, max_bs, max_num_tokens, block_kv_indices=None):
        self.cuda_graph_kv_indices = torch.ones(max_bs, 9, dtype=torch.int32)

    monkeypatch.setattr(flashmla_backend.FlashMLABackend, "init_cuda_graph_state", flashmla_graph_state)
    monkeypatch.setattr(flashmla_backend.FlashMLABackend, "init_forward_metadata_out_graph", lambda *a, **k: None)
    be = object.__new__(backend_class())
    be.snapmla_graph_seq_lens, be.skips_flashmla_schedule = None, True
    with pytest.raises(RuntimeError, match="before init_cuda_graph_state"):
        be.init_forward_metadata_out_graph(None, in_capture=True)
    be.init_cuda_graph_state(48, 48 * 3)
    lens = be.snapmla_graph_seq_lens
    assert lens.shape == (48,) and lens.dtype == torch.int32 and lens.device == be.cuda_graph_kv_indices.device


@pytest.mark.parametrize("accepted", [[1, 3, 2], [3, 3, 3]])
def test_draft_extend_attends_over_the_window_aligned_lengths(gen, monkeypatch, accepted):
    """Eager MTP draft extend where requests accepted fewer draft tokens than the window: SGLang passes seq_lens =
    prefix + accepted and extend_seq_lens = accepted (the inputs padded to the window), and FlashMLA's metadata
    aligns the keys to the padded window (seq_lens_k = prefix + window). Every query row of the window attends as the
    spec over prefix + window says; lengths cut to the accepted tokens would shift each request's causal window."""
    monkeypatch.setattr(decode_plan, "decode_impl", lambda requested=None: "triton")
    window, lens = 3, [130 + 64 * 3, 77, 300]
    proto = GraphProtocol(16, max_bs=5, lens=lens, gen=gen, device="cpu", window=window, max_context_len=1024)
    q, q_rope = proto.queries("draft_extend")
    runner = torch.tensor(lens) + torch.tensor(accepted)
    fb = proto._forward_batch("draft_extend", runner, runner, torch.arange(1, len(lens) + 1))
    fb.extend_seq_lens = torch.tensor(accepted)
    proto.backend.init_forward_metadata(fb)
    out = proto.forward("draft_extend", fb, q, q_rope)
    assert_close(out.float(), proto.reference("draft_extend", q, q_rope), rel_l2=3e-2,
                 what=f"draft extend, accepted {accepted} of {window}")
