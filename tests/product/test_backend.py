"""SnapMLABackend's own logic on CPU (interpreter): decode, target verify and absorbed extend against the reference.

SnapMLAForward holds the backend's forward paths; SGLang's FlashMLA base class needs sgl_kernel's GPU ops, so here
the fields those paths read are set directly: the pool, req_to_token, FlashMLA's block table, the draft window."""

import logging
from types import SimpleNamespace

import pytest
import torch

from helpers import assert_close
from sglang_snapmla import numerics as nx

pytestmark = pytest.mark.cpu_interpreter  # the backend runs on --device cpu here (Triton interpreter)

SCALE = 576**-0.5
# heads per rank: 8 (small), 64 = DeepSeek-V3's 128 under TP 2; the backend reads layer.tp_q_head_num
HEADS_PER_RANK = [8, 64]


@pytest.fixture(params=HEADS_PER_RANK, ids=[f"h{h}" for h in HEADS_PER_RANK])
def heads(request):
    return request.param


@pytest.fixture
def setup(gen, heads):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: F401  (import check)

    from sglang_snapmla import plugin
    from sglang_snapmla.backend import SnapMLAForward
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    plugin.register()
    pool = SnapMLATokenToKVPool(size=64 * 12, page_size=64, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=1, device="cpu", enable_memory_saver=False)
    backend = SnapMLAForward()
    backend.token_to_kv_pool = pool
    backend.max_pages = 8
    backend.num_draft_tokens = 2
    backend.num_q_heads = heads
    # two requests, each owning shuffled whole pages (SGLang allocates page-aligned slots with page size 64)
    pages = (torch.randperm(12, generator=gen)[:8] + 1).reshape(2, 4)
    backend.req_to_token = (pages[:, :, None] * 64 + torch.arange(64)).reshape(2, -1).to(torch.int32)
    backend.forward_metadata = SimpleNamespace(block_kv_indices=pages.to(torch.int32), seq_lens_k=None)
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=heads, scaling=SCALE)
    return backend, pool, layer


def fill(pool, layer, slots, gen):
    nope = torch.randn(len(slots), 1, 512, generator=gen).to(torch.bfloat16)
    rope = torch.randn(len(slots), 1, 64, generator=gen).to(torch.bfloat16)
    pool.set_mla_kv_buffer(layer, slots.long(), nope, rope)


def reference(pool, q_nope, q_rope, block_table, seq_lens):
    """Reference decode over the pool's own (quantized) contents. q_*: [B, s_q, H, D] bf16."""
    kv, scale, rope = pool.snapmla_buffers(0)
    q = nx.quantize_q(q_nope, q_rope)
    return nx.snapmla_decode_reference(q, nx.LatentCache(kv, scale, rope), block_table, seq_lens, SCALE)[0]


def extend_batch(prefix, ext, out_cache_loc=None):
    """A ForwardBatch stand-in for an extend step of len(ext) requests in req_to_token rows 0, 1, ...: prefix[b]
    cached tokens and ext[b] new ones each."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(forward_mode=ForwardMode.EXTEND, out_cache_loc=out_cache_loc, extend_seq_lens_cpu=ext,
                           seq_lens_cpu=torch.tensor([p + e for p, e in zip(prefix, ext)]),
                           req_pool_indices=torch.arange(len(ext)))


def count_launch_plans(monkeypatch) -> list:
    """The calls of extend.plan_absorbed_launches from here on, recorded (the planning still runs)."""
    from sglang_snapmla import extend

    calls, plan_launches = [], extend.plan_absorbed_launches
    monkeypatch.setattr(extend, "plan_absorbed_launches", lambda *a: calls.append(a) or plan_launches(*a))
    return calls


def assert_extend_matches_spec(backend, pool, out, q, qr, ext, seq):
    """out [T, H * 512] of an extend whose request b owns ext[b] consecutive rows and the keys of block-table row b up
    to seq[b], against the reference decode of each request's rows."""
    heads, start = q.shape[1], 0
    for b, e in enumerate(ext):
        rows = slice(start, start + e)
        ref = reference(pool, q[rows].unsqueeze(0), qr[rows].unsqueeze(0),
                        backend.forward_metadata.block_kv_indices[b: b + 1], seq[b: b + 1].to(torch.int32))
        assert_close(out[rows].float().view(1, e, heads, 512), ref, rel_l2=1e-2, what=f"request {b}")
        start += e


def absorbed_q_nope(tokens: int, heads: int, gen, layout: str) -> torch.Tensor:
    """q_nope [T, H, 512] as the model hands it to the attention: "contiguous"; "head_major" as SGLang 0.5.17's
    absorbed path makes it (the per-head BMM's [H, T, 512] output, transposed); "head_major_padded" as it makes it
    with SGL_USE_DEEPGEMM_BMM=1 from DeepGEMM's masked GEMM, whose output holds an aligned number of rows per head
    (here T + 5), cut to T."""
    if layout == "contiguous":
        return torch.randn(tokens, heads, 512, generator=gen).to(torch.bfloat16)
    rows = tokens + 5 if layout == "head_major_padded" else tokens
    out = torch.randn(heads, rows, 512, generator=gen).to(torch.bfloat16)[:, :tokens, :].transpose(0, 1)
    assert out.stride() == (512, rows * 512, 1)
    return out


Q_LAYOUT_LINES = {
    "contiguous": "contiguous",
    "head_major": "head-major (the absorbed BMM's [heads, tokens, 512], transposed)",
    "head_major_padded": "head-major, padded: 7 rows per head for 2 tokens (DeepGEMM's masked GEMM)",
}


@pytest.mark.parametrize("layout", ["contiguous", "head_major", "head_major_padded"])
def test_decode_and_target_verify(setup, gen, heads, layout, caplog):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla import backend as backend_module

    H = heads

    backend, pool, layer = setup
    caplog.set_level(logging.INFO, logger=backend_module.__name__)
    lens = torch.tensor([130, 70], dtype=torch.int32)
    for b in range(2):
        fill(pool, layer, backend.req_to_token[b, : lens[b] + 2], gen)
    for mode, s_q in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, 2)):
        q = absorbed_q_nope(2 * s_q, H, gen, layout)
        qr = torch.randn(2 * s_q, H, 64, generator=gen).to(torch.bfloat16)
        fb = SimpleNamespace(forward_mode=mode, batch_size=2, seq_lens=lens, out_cache_loc=None)
        backend.plan_step(fb)  # as the backend's init_forward_metadata does after FlashMLA's
        if s_q == 1:
            out = backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
            seq = lens
        else:
            out = backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
            seq = lens + 2  # verify: the draft tokens follow the committed ones
        ref = reference(pool, q.reshape(2, s_q, H, 512), qr.view(2, s_q, H, 64), backend.forward_metadata.block_kv_indices,
                        seq)
        assert out.shape == (2 * s_q, H * 512)
        assert_close(out.float().view(2, s_q, H, 512), ref, rel_l2=1e-2, what=str(mode))
    # each kind of layout logged once (a GPU server's log then says which ones SGLang handed over)
    said = [r.getMessage() for r in caplog.records if "q_nope [tokens, heads, 512] arrives" in r.getMessage()]
    assert said == ["snapmla: q_nope [tokens, heads, 512] arrives " + Q_LAYOUT_LINES[layout]], said


def test_each_q_layout_is_logged_once_in_the_order_a_graph_capture_meets_them(gen, caplog):
    """A DeepGEMM BMM server captures its graphs from 256 requests down: at 256 its rows per head equal the tokens
    (256-aligned), so only the next size shows the padding. Each kind is logged the first time, never again. SGLang
    views q_nope as [tokens, heads, 512] after slicing the padded rows, which at one token makes its token stride
    heads x rows x 512 (what an H200 server logged at batch 1): still the padded layout, and a lone token of a
    contiguous q is contiguous whatever its token stride."""
    from sglang_snapmla import backend as backend_module

    caplog.set_level(logging.INFO, logger=backend_module.__name__)
    forward = backend_module.SnapMLAForward.__new__(backend_module.SnapMLAForward)
    forward._log_q_layout(torch.empty(1, 2, 512, dtype=torch.bfloat16).as_strided((1, 2, 512), (7, 512, 1)))
    for tokens, rows in ((256, 256), (192, 256), (8, 256), (1, 256)):
        q = torch.empty(2, rows, 512, dtype=torch.bfloat16)[:, :tokens].transpose(0, 1).view(tokens, 2, 512)
        forward._log_q_layout(q)
    assert q.stride() == (2 * 256 * 512, 256 * 512, 1)  # the lone token's stride as the view leaves it
    forward._log_q_layout(torch.empty(3, 2, 512, dtype=torch.bfloat16))
    said = [r.getMessage().split("arrives ")[1] for r in caplog.records if "arrives" in r.getMessage()]
    assert said == ["contiguous", Q_LAYOUT_LINES["head_major"],
                    "head-major, padded: 256 rows per head for 192 tokens (DeepGEMM's masked GEMM)"], said
    assert backend_module.SnapMLAForward.q_layouts_logged == frozenset()  # per backend, not per class


def test_decode_and_target_verify_write_the_new_keys_before_they_attend(setup, gen, heads):
    """As the model calls it (save_kv_cache=True, the step's new K in k / k_rope): the new tokens' keys go into their
    slots, which held another request's bytes, before the attention reads them -- each new query sees its own key
    and the ones before it. With save_kv_cache=False the pool is left as it is."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend, pool, layer = setup
    lens = torch.tensor([130, 70], dtype=torch.int32)  # committed tokens, the step's new ones included for decode
    for mode, s_q, seq in ((ForwardMode.DECODE, 1, lens), (ForwardMode.TARGET_VERIFY, 2, lens + 2)):
        new = torch.cat([backend.req_to_token[b, seq[b] - s_q: seq[b]] for b in range(2)])  # request-major
        for b in range(2):
            fill(pool, layer, backend.req_to_token[b, : seq[b]], gen)  # the new slots too: stale bytes there
        k = torch.randn(2 * s_q, 1, 512, generator=gen).to(torch.bfloat16)
        k_rope = torch.randn(2 * s_q, 1, 64, generator=gen).to(torch.bfloat16)
        q = torch.randn(2 * s_q, heads, 512, generator=gen).to(torch.bfloat16)
        qr = torch.randn(2 * s_q, heads, 64, generator=gen).to(torch.bfloat16)
        fb = SimpleNamespace(forward_mode=mode, batch_size=2, seq_lens=lens, out_cache_loc=new.long())
        backend.plan_step(fb)
        forward = backend.forward_decode if s_q == 1 else backend.forward_extend
        out = forward(q, k, None, layer, fb, save_kv_cache=True, q_rope=qr, k_rope=k_rope)
        kv, scale, rope = pool.snapmla_buffers(0)
        written = nx.quantize_kv(k[:, 0], k_rope[:, 0])
        assert torch.equal(kv[new], written.content) and torch.equal(rope[new], written.rope), str(mode)
        ref = reference(pool, q.view(2, s_q, heads, 512), qr.view(2, s_q, heads, 64),
                        backend.forward_metadata.block_kv_indices, seq)
        assert_close(out.float().view(2, s_q, heads, 512), ref, rel_l2=1e-2, what=f"{mode}, new keys written first")
        # save_kv_cache=False (the model wrote the keys itself): the backend writes nothing, whatever k holds
        before = [t[new].clone() for t in (kv, scale, rope)]
        forward(q, torch.randn_like(k), None, layer, fb, save_kv_cache=False, q_rope=qr,
                k_rope=torch.randn_like(k_rope))
        assert all(torch.equal(t[new], b) for t, b in zip((kv, scale, rope), before)), f"{mode}: save_kv_cache=False"


def test_a_step_is_planned_once_by_its_metadata_and_replans_at_a_replay(setup, gen, heads, monkeypatch):
    """The step's plan, int32 lengths and checks are made once, by the forward-metadata hooks (`plan_step`), and every
    layer runs them. Under CUDA graphs the lengths go into a static buffer at capture and again at every replay (the
    captured kernels read it): here the lengths change in place and the replay hook runs again, as SGLang's runner
    does, and the forward must read the new ones. A forward whose batch the plan was not made for is refused."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla import decode_plan

    backend, pool, layer = setup
    lens = torch.tensor([130, 70], dtype=torch.int64)  # SGLang's lengths are int64: the plan casts them
    for b in range(2):
        fill(pool, layer, backend.req_to_token[b, :200], gen)
    q = torch.randn(2, heads, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(2, heads, 64, generator=gen).to(torch.bfloat16)
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, seq_lens=lens, out_cache_loc=None)
    layer1 = SimpleNamespace(layer_id=1, tp_q_head_num=heads, scaling=SCALE)
    pool.snapmla_buffers = lambda layer_id, buffers=pool.snapmla_buffers: buffers(0)  # layer 1 reads layer 0's pages
    plans = []
    monkeypatch.setattr(decode_plan, "plan_decode",
                        lambda *a, real=decode_plan.plan_decode, **k: plans.append(a) or real(*a, **k))
    static_lens = torch.ones(4, dtype=torch.int32)
    backend.plan_step(fb, graph_seq_lens=static_lens)  # capture
    first = backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
    assert torch.equal(backend.forward_decode(q, None, None, layer1, fb, save_kv_cache=False, q_rope=qr), first)
    assert len(plans) == 1 and backend.step_plan.seq_lens.data_ptr() == static_lens.data_ptr()
    lens.copy_(torch.tensor([190, 5]))
    backend.plan_step(fb, graph_seq_lens=static_lens)  # replay
    again = backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
    ref = reference(pool, q.view(2, 1, heads, 512), qr.view(2, 1, heads, 64), backend.forward_metadata.block_kv_indices,
                    lens.to(torch.int32))
    assert_close(again.float().view(2, 1, heads, 512), ref, rel_l2=1e-2, what="the replayed step")
    verify = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=2, seq_lens=lens, out_cache_loc=None)
    with pytest.raises(RuntimeError, match=r"its plan is for \[2, 1, %d\]" % heads):
        backend.forward_extend(torch.cat([q, q]), None, None, layer, verify, save_kv_cache=False,
                               q_rope=torch.cat([qr, qr]))


def test_absorbed_extend_writes_and_attends(setup, gen, heads, monkeypatch):
    H = heads

    backend, pool, layer = setup
    prefix, ext = [100, 3], [5, 61]  # prefix + new tokens per request; lengths not multiples of 64
    for b in range(2):
        fill(pool, layer, backend.req_to_token[b, : prefix[b]], gen)
    total = sum(ext)
    q = torch.randn(total, H, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(total, H, 64, generator=gen).to(torch.bfloat16)
    k = torch.randn(total, 1, 512, generator=gen).to(torch.bfloat16)
    kr = torch.randn(total, 1, 64, generator=gen).to(torch.bfloat16)
    loc = torch.cat([backend.req_to_token[b, prefix[b]: prefix[b] + ext[b]] for b in range(2)]).long()
    fb = extend_batch(prefix, ext, loc)
    seq = fb.seq_lens_cpu
    planned = count_launch_plans(monkeypatch)
    backend.plan_step(fb)  # SGLang's forward-metadata hook, once per step
    out = backend.forward_extend(q, k, None, layer, fb, save_kv_cache=True, q_rope=qr, k_rope=kr)
    got_k, _ = pool.get_mla_kv_buffer(layer, loc)
    ref_k, _ = nx.dequantize_kv(nx.quantize_kv(k[:, 0], kr[:, 0]))
    assert torch.equal(got_k[:, 0], ref_k), "new tokens were not appended at out_cache_loc"
    assert_extend_matches_spec(backend, pool, out, q, qr, ext, seq)
    # the absorbed MQA layer (head dim 576) called with q as latent + RoPE concatenated (no q_rope, as SGLang's
    # attention kits and concatenating model paths do) takes the same path, not MHA prefill
    mqa = SimpleNamespace(**vars(layer), head_dim=512 + 64)
    again = backend.forward_extend(torch.cat([q, qr], -1), None, None, mqa, fb, save_kv_cache=False)
    assert torch.equal(again, out)
    assert len(planned) == 1, "the step's layers share the launches of its plan"


@pytest.mark.parametrize("route", ["absorbed", "mha"])
def test_a_step_the_route_sends_absorbed_is_planned_whole_by_its_hook(setup, gen, heads, monkeypatch, route):
    """Where the route is absorbed MLA, the forward-metadata hook plans the launches with the route and no layer plans
    again; where it is MHA (SGLang may still run absorbed MLA, e.g. in captured prefill), the first absorbed layer
    plans them. Either way the output matches the spec."""
    backend, pool, layer = setup
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", route)
    prefix, ext = [100, 3], [5, 61]
    for b in range(2):
        fill(pool, layer, backend.req_to_token[b, : prefix[b] + ext[b]], gen)
    fb = extend_batch(prefix, ext)
    seq = fb.seq_lens_cpu
    planned = count_launch_plans(monkeypatch)
    backend.plan_step(fb)
    assert backend.step_plan.absorbed == (route == "absorbed") and len(planned) == (route == "absorbed")
    q = torch.randn(sum(ext), heads, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(sum(ext), heads, 64, generator=gen).to(torch.bfloat16)
    out = backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
    assert len(planned) == 1
    assert_extend_matches_spec(backend, pool, out, q, qr, ext, seq)


def test_a_batch_object_extended_again_with_other_lengths_is_planned_again(setup, gen, heads, caplog):
    """SGLang may hand the backend the same ForwardBatch object for another step with other lengths: the absorbed
    extend must attend with that step's own lengths (each output against the spec), never with the plan of the
    object's previous contents; a layer whose batch differs from the step's plan (metadata built on another view of
    the batch) is planned again from its own batch, logged once."""
    import logging

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla import backend as backend_module

    backend, pool, layer = setup
    prefix = [100, 3]
    for b in range(2):
        fill(pool, layer, backend.req_to_token[b, : prefix[b] + 64], gen)
    fb = SimpleNamespace(forward_mode=ForwardMode.EXTEND, out_cache_loc=None, req_pool_indices=torch.tensor([0, 1]))
    backend_module._log_extend_replanned.cache_clear()
    for ext, hooked in (([5, 61], True), ([40, 2], True), ([7, 30], False), ([9, 9], False)):
        fb.extend_seq_lens_cpu = ext
        fb.seq_lens_cpu = torch.tensor([p + e for p, e in zip(prefix, ext)])
        if hooked:  # the forward-metadata hook ran for this step
            backend.plan_step(fb)
        q = torch.randn(sum(ext), heads, 512, generator=gen).to(torch.bfloat16)
        qr = torch.randn(sum(ext), heads, 64, generator=gen).to(torch.bfloat16)
        out = backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
        assert_extend_matches_spec(backend, pool, out, q, qr, ext, fb.seq_lens_cpu)
    replanned = [r for r in caplog.records if "planned again" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(replanned) == 1, "the two steps without their hook are planned again, and that is logged once"


def _four_requests(backend, pool, layer, gen, seq):
    """req_to_token with 4 requests of 2 whole pages each (the setup's 8 shuffled pages), keys up to max(seq)
    written: two steps of the same lengths over requests (0, 1) and (2, 3) attend over different pages."""
    pages = backend.forward_metadata.block_kv_indices.reshape(4, 2)
    backend.req_to_token = (pages[:, :, None] * 64 + torch.arange(64)).reshape(4, -1).to(torch.int32)
    for r in range(4):
        fill(pool, layer, backend.req_to_token[r, : max(seq)], gen)
    return pages


def _absorbed_step(backend, layer, gen, fb, pages, heads):
    """One absorbed-extend layer over `fb`'s requests; FlashMLA's block table set to their pages (the spec reads it)."""
    backend.forward_metadata.block_kv_indices = pages[fb.req_pool_indices.long()].to(torch.int32)
    q = torch.randn(sum(fb.extend_seq_lens_cpu), heads, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(q.shape[0], heads, 64, generator=gen).to(torch.bfloat16)
    return backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr), q, qr


@pytest.mark.parametrize("hooked", [True, False], ids=["both-hooked", "second-unhooked"])
def test_steps_of_equal_lengths_over_other_requests_attend_their_own_pages(setup, gen, heads, monkeypatch, caplog,
                                                                           hooked):
    """Two prefill steps with the same lengths over different requests: each attends over its own requests' pages
    (output against the spec), whether the second step's forward-metadata hook ran (`plan_step` plans it for its
    batch, and no layer plans again) or not (the layer finds that the held plan is for other requests and plans
    again, logged)."""
    import logging

    from sglang_snapmla import backend as backend_module

    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "absorbed")
    backend, pool, layer = setup
    prefix, ext = [100, 3], [5, 61]
    seq = [p + e for p, e in zip(prefix, ext)]
    pages = _four_requests(backend, pool, layer, gen, seq)
    backend_module._log_extend_replanned.cache_clear()
    for step, rows in enumerate(([0, 1], [2, 3])):
        fb = extend_batch(prefix, ext)
        fb.req_pool_indices = torch.tensor(rows)
        if step == 0 or hooked:
            backend.plan_step(fb)
            assert backend.step_plan.fits(fb), "the hook planned this step's own batch"
        with caplog.at_level(logging.WARNING, logger=backend_module.__name__):
            out, q, qr = _absorbed_step(backend, layer, gen, fb, pages, heads)
        assert_extend_matches_spec(backend, pool, out, q, qr, ext, fb.seq_lens_cpu)
    replanned = [r for r in caplog.records if "planned again" in r.getMessage()]
    assert len(replanned) == (0 if hooked else 1)


def test_a_padded_idle_batch_is_planned_as_a_decode(setup):
    """Under DP attention a rank without requests runs a padded idle batch beside the others' decode, and SGLang replays
    the decode graph for it: its metadata hook must plan it as a decode step and write its lengths into the graph's
    buffer (left stale, they would steer the replayed kernels over the pages of an earlier step)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla.backend import StepPlan

    backend, _, _ = setup
    graph_lens = torch.full((4,), 200, dtype=torch.int32)  # an earlier replay's lengths
    fb = SimpleNamespace(forward_mode=ForwardMode.IDLE, batch_size=2, seq_lens=torch.ones(2, dtype=torch.int64))
    backend.plan_step(fb, graph_seq_lens=graph_lens)
    assert isinstance(backend.step_plan, StepPlan) and backend.step_plan.decode.s_q == 1
    assert graph_lens.tolist() == [1, 1, 200, 200]


def test_a_step_whose_block_table_the_kernels_cannot_read_is_refused_when_planned(setup):
    """The step's checks run in its forward-metadata hook, before any layer launches a kernel: a block table of int64
    page ids (the kernels read int32) or a column-major one is refused there, naming what the kernels need."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla.errors import SnapMLAInputError

    backend, _, _ = setup
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, seq_lens=torch.tensor([70, 5]))
    table = backend.forward_metadata.block_kv_indices
    backend.plan_step(fb)  # FlashMLA's int32 row-major table: planned
    backend.forward_metadata.block_kv_indices = table.long()
    with pytest.raises(SnapMLAInputError, match=r"block_table must be \[B=2, max_pages\] int32"):
        backend.plan_step(fb)
    backend.forward_metadata.block_kv_indices = table.t().contiguous().t()
    with pytest.raises(SnapMLAInputError, match="unit stride in its last dim"):
        backend.plan_step(fb)


def test_index_checks_cover_every_absorbed_extend_launch(setup, monkeypatch):
    """With SNAPMLA_CHECK_INDICES=1 each absorbed-extend launch's block table, gathered from req_to_token, is checked
    against the pool when the step is planned: a request whose slots name a page past the pool is refused by name
    before any layer runs (without the opt-in, nothing reads device values on the host)."""
    from sglang_snapmla.errors import SnapMLAInputError

    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "absorbed")
    monkeypatch.setenv("SNAPMLA_CHECK_INDICES", "1")
    backend, pool, _ = setup
    prefix, ext = [100, 3], [5, 61]
    backend.plan_step(extend_batch(prefix, ext))  # the setup's pages, all in the pool: planned
    backend.req_to_token[1, :64] += 64 * 40  # request 1's first page: 40 pages past its own, outside the pool
    page = int(backend.req_to_token[1, 0]) // 64
    with pytest.raises(SnapMLAInputError, match=rf"uses page ids in \[{page}, {page}\], outside the pool's"):
        backend.plan_step(extend_batch(prefix, ext))


def test_a_step_of_another_mode_leaves_no_plan_behind(setup, gen):
    """A batch the backend does not plan (here PREBUILT, a PD decode server's batch whose cache was transferred) clears
    the previous step's plan: a decode layer of the same shape that then runs without a plan of its own is refused
    instead of reading the earlier step's lengths and pages."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend, _, layer = setup
    heads = layer.tp_q_head_num
    q = torch.randn(2, heads, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(2, heads, 64, generator=gen).to(torch.bfloat16)
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, seq_lens=torch.tensor([70, 5]),
                             out_cache_loc=None)
    backend.plan_step(decode)
    backend.forward_decode(q, None, None, layer, decode, save_kv_cache=False, q_rope=qr)  # planned: runs
    backend.plan_step(SimpleNamespace(forward_mode=ForwardMode.PREBUILT, batch_size=2))
    assert backend.step_plan is None
    with pytest.raises(RuntimeError, match=r"its plan is for None"):
        backend.forward_decode(q, None, None, layer, decode, save_kv_cache=False, q_rope=qr)


def test_absorbed_launches_are_planned_per_head_count(setup, heads):
    """A step's absorbed-MLA launches are kept per head count: a layer of other heads than the step's plan gets
    launches planned for its own heads (their decode plans size the splits and partials by the heads), never those of
    another head count."""
    backend, _, _ = setup
    plan = backend._plan_extend(extend_batch([100, 3], [5, 61]))
    own = backend._plan_launches(plan, heads, torch.device("cpu"))
    other = backend._plan_launches(plan, 2 * heads, torch.device("cpu"))
    assert own and {d.heads for _, d in own} == {heads} and {d.heads for _, d in other} == {2 * heads}
    assert backend._plan_launches(plan, heads, torch.device("cpu")) is own


def test_a_plan_fits_only_its_own_batch():
    """`ExtendPlan.fits`: the very req_pool_indices tensor, unwritten since, and the same lengths; inference tensors
    (SGLANG_ENABLE_TORCH_INFERENCE_MODE) keep no version counter and are compared by object and lengths."""
    from sglang_snapmla.backend import SnapMLAForward

    backend = SnapMLAForward()
    backend.num_q_heads = 8
    fb = extend_batch([0, 0], [5, 7])  # no prefix: the route needs no launches
    plan = backend._plan_extend(fb)
    assert plan.fits(fb)
    assert not plan.fits(extend_batch([0, 0], [5, 7])), "another batch's requests"
    fb.req_pool_indices.add_(2)
    assert not plan.fits(fb), "the same tensor written in place"
    with torch.inference_mode():
        fb = extend_batch([0, 0], [5, 7])
        plan = backend._plan_extend(fb)
        assert plan.requests_version is None and plan.fits(fb)
        assert not plan.fits(extend_batch([0, 0], [5, 7]))
        fb.extend_seq_lens_cpu = [5, 6]
        assert not plan.fits(fb), "other lengths"


def test_a_request_buffer_rewritten_in_place_is_planned_again(setup, gen, heads, monkeypatch):
    """The same req_pool_indices tensor written in place with other requests (a reused or static buffer) and the same
    lengths, without the hook: the layer plans again (the tensor's version moved) and attends the new requests."""
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "absorbed")
    backend, pool, layer = setup
    prefix, ext = [100, 3], [5, 61]
    pages = _four_requests(backend, pool, layer, gen, [p + e for p, e in zip(prefix, ext)])
    fb = extend_batch(prefix, ext)
    fb.req_pool_indices = torch.tensor([0, 1])
    backend.plan_step(fb)
    _absorbed_step(backend, layer, gen, fb, pages, heads)
    fb.req_pool_indices.copy_(torch.tensor([3, 2]))
    out, q, qr = _absorbed_step(backend, layer, gen, fb, pages, heads)
    assert_extend_matches_spec(backend, pool, out, q, qr, ext, fb.seq_lens_cpu)


def test_absorbed_extend_batches_requests_of_unequal_spans(gen, heads):
    """Five requests, one launch per group of similar new spans (61 and 48 share a 61-token window, 5 and 4 a 5-token
    one; a request without new tokens takes none): every real token matches its own request's reference, whatever
    the padding its window carries; q holds 7 rows past the batch's tokens, as in a padded prefill-graph bucket."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_snapmla import extend, plugin
    from sglang_snapmla.backend import SnapMLAForward
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    plugin.register()
    H = heads
    prefix, ext = [100, 3, 0, 64, 70], [5, 61, 4, 0, 48]
    pool = SnapMLATokenToKVPool(size=64 * 12, page_size=64, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=1, device="cpu", enable_memory_saver=False)
    backend = SnapMLAForward()
    backend.token_to_kv_pool = pool
    backend.max_pages = 8
    pages = (torch.randperm(12, generator=gen)[:10] + 1).reshape(5, 2)
    # request i lives in req_to_token row order[i]: the plan must read each request's own row
    order = torch.tensor([3, 0, 4, 1, 2])
    backend.req_to_token = torch.zeros(5, 128, dtype=torch.int32)
    backend.req_to_token[order] = (pages[:, :, None] * 64 + torch.arange(64)).reshape(5, -1).to(torch.int32)
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H, scaling=SCALE)
    for b in range(5):
        fill(pool, layer, backend.req_to_token[order[b], : prefix[b] + ext[b]], gen)
    padded = sum(ext) + 7
    q = torch.randn(padded, H, 512, generator=gen).to(torch.bfloat16)
    qr = torch.randn(padded, H, 64, generator=gen).to(torch.bfloat16)
    seq = torch.tensor([p + e for p, e in zip(prefix, ext)])
    fb = SimpleNamespace(forward_mode=ForwardMode.EXTEND, out_cache_loc=None, extend_seq_lens_cpu=ext,
                         seq_lens_cpu=seq, req_pool_indices=order)
    launches = extend.plan_absorbed_launches(ext, seq.tolist(), order, backend.req_to_token)
    assert [(launch.s_q, launch.seq_lens.tolist()) for launch in launches] == [(61, [64, 118]), (5, [105, 4])]
    backend.num_q_heads = H
    backend.plan_step(fb)
    out = backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False, q_rope=qr)
    assert out.shape == (padded, H * 512)
    start = 0
    for b in range(5):
        rows = slice(start, start + ext[b])
        if ext[b]:
            table = (backend.req_to_token[order[b], ::64] // 64).to(torch.int32).unsqueeze(0)
            ref = reference(pool, q[rows].unsqueeze(0), qr[rows].unsqueeze(0), table, seq[b: b + 1].to(torch.int32))
            assert_close(out[rows].float().view(1, ext[b], H, 512), ref, rel_l2=1e-2, what=f"request {b}")
        start += ext[b]
