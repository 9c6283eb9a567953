"""The route of a prefill over a cached prefix (sglang_snapmla.extend): the launch groups, the cost model's choice
and its pins, and the plugin's dispatch handler that applies it the way SGLang's DeepSeek attention asks per layer."""

from types import SimpleNamespace

import pytest
import torch

from sglang_snapmla import extend


def test_groups_keep_padding_under_a_third_and_skip_empty_spans():
    lens = [5, 61, 4, 0, 48, 1000, 700, 800]
    groups = extend.group_requests(lens)
    assert groups == [[5, 7], [6], [1, 4], [0, 2]]
    for g in groups:
        assert all(lens[i] >= extend.LAUNCH_FILL * lens[g[0]] for i in g)
    assert sorted(i for g in groups for i in g) == [i for i, e in enumerate(lens) if e]
    assert extend.group_requests([4, 3, 2]) == [[0, 1], [2]]  # exactly 3/4 of the longest still joins: 33 % padding


def test_each_absorbed_window_reads_only_its_own_requests_rows():
    """Every position of a launch's window reads a row of its own request: its real tokens their own rows in order,
    its left padding the request's first token. A padding row past the request would read the next request's token,
    or past the batch's last row where the last request is padded (the batch may have no rows beyond it)."""
    ext = [5, 61, 4, 0, 48, 3, 2]  # 48 pads to 61 and is the batch's last padded request; 4 and 3 pad to 5
    prefix = [100, 3, 0, 64, 70, 7, 0]
    seq = [p + e for p, e in zip(prefix, ext)]
    req_to_token = torch.arange(len(ext) * 256, dtype=torch.int32).view(len(ext), 256)
    starts = [sum(ext[:i]) for i in range(len(ext))]
    launches = extend.plan_absorbed_launches(ext, seq, torch.arange(len(ext)), req_to_token)
    covered = []
    for launch in launches:
        assert torch.equal(launch.rows[launch.src], launch.dst)  # a real token's position reads its own row
        windows = launch.rows.view(-1, launch.s_q)
        for b, window in enumerate(windows):
            own = launch.dst[launch.src // launch.s_q == b]
            i = next(j for j, e in enumerate(ext) if e and starts[j] == int(own[0]))  # request 3 starts there too
            assert own.tolist() == list(range(starts[i], starts[i] + ext[i]))
            assert window.tolist() == [starts[i]] * (launch.s_q - ext[i]) + own.tolist(), (i, window)
            covered.append(i)
    assert sorted(covered) == [i for i, e in enumerate(ext) if e]


def test_the_absorbed_route_is_priced_on_its_padded_launches():
    """A launch runs every member at its longest new span (left-padded windows) over its longest sequence: the
    cost model's absorbed pairs count those padded rows, the MHA route's only the real ones (causal)."""
    prefix, ext, heads = [1000, 1000, 5000], [100, 80, 10], 4
    assert extend.group_requests(ext) == [[0, 1], [2]]
    (_, pairs), (_, upproj, mha_pairs) = extend.route_units(prefix, ext, heads)
    assert pairs == (2 * 100 * 1100 + 10 * 5010) * heads
    assert upproj == 7000 * heads
    assert mha_pairs == sum(e * (p + (e + 1) / 2) for p, e in zip(prefix, ext)) * heads


def test_each_absorbed_window_attends_over_its_own_requests_pages(gen):
    """A launch's block-table row b and length b are those of the request whose window is row b, also where a
    group lists a later request first (the longest span leads) and the requests' pool rows are permuted; the table
    holds page ids (slots / 64) up to the group's longest sequence."""
    ext, prefix = [48, 61, 5, 4], [300, 70, 0, 129]
    seq = [p + e for p, e in zip(prefix, ext)]
    assert extend.group_requests(ext) == [[1, 0], [2, 3]]
    pool_rows = torch.tensor([2, 0, 3, 1])
    pages = torch.randperm(64, generator=gen)[:32].view(4, 8)  # each pool row's 8 pages, distinct
    req_to_token = (pages.repeat_interleave(64, dim=1) * 64 + torch.arange(512) % 64).to(torch.int32)
    starts = [sum(ext[:i]) for i in range(len(ext))]
    for launch in extend.plan_absorbed_launches(ext, seq, pool_rows, req_to_token):
        members = []
        for b in range(launch.block_table.shape[0]):
            own = launch.dst[launch.src // launch.s_q == b]
            i = starts.index(int(own[0]))
            members.append(i)
            assert launch.block_table[b].tolist() == pages[pool_rows[i], :launch.max_pages].tolist(), (i, b)
            assert int(launch.seq_lens[b]) == seq[i]
        assert launch.max_pages == -(-max(seq[i] for i in members) // 64)


@pytest.mark.parametrize("heads", [16, 128])
def test_short_questions_over_long_prefixes_go_absorbed_long_spans_go_mha(heads, monkeypatch):
    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)
    # 16 requests, each a 128-token question after a 4 096-token shared system prompt
    assert extend.prefers_absorbed([4096] * 16, [128] * 16, heads)
    # the next turn of a 32k conversation
    assert extend.prefers_absorbed([32768], [200], heads)
    # chunked prefill of a long document: 8 192 new tokens after 16k
    assert not extend.prefers_absorbed([16384], [8192], heads)
    # no cached prefix: MHA prefill, always
    assert not extend.prefers_absorbed([0, 0], [16, 16], heads)
    assert not extend.prefers_absorbed(None, [16], heads)


def test_the_cost_model_crossover_sits_where_the_flop_counts_put_it(monkeypatch):
    """Per (request, head), absorbed costs e x t x absorbed_pair, MHA p x mha_upproj + e x (p + e/2) x mha_pair:
    with a long prefix the crossover is e* ~ mha_upproj / (absorbed_pair - mha_pair)."""
    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)
    c = extend.ROUTE_COSTS
    crossover = c.mha_upproj / (c.absorbed_pair - c.mha_pair)
    p = 1 << 20
    assert extend.prefers_absorbed([p], [int(crossover * 0.9)], 128)
    assert not extend.prefers_absorbed([p], [int(crossover * 1.1)], 128)


@pytest.mark.parametrize("saved,kv_b_proj", [("extend_routes_h100.json", "bf16"), ("extend_routes_fp8_h200.json", "fp8")])
def test_the_cost_model_is_the_one_the_saved_route_benchmark_ran(monkeypatch, saved, kv_b_proj):
    """results/bench/ (benchmarks/bench_extend_routes.py, 20 cases at 16 and 128 heads): the H100 run with a BF16
    kv_b_proj, which ROUTE_COSTS is fitted to, and the H200 run with an FP8 checkpoint's W8A8 kv_b_proj
    (`--kv-b-proj fp8`). The route costs recomputed for each case are the predictions it saved, the route the model
    picks is the one it picked, and that is the faster measured route in every case of both (docs/BENCHMARKS.md's
    claim: one cost model serves both weight formats)."""
    import json
    from pathlib import Path

    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)
    rows = json.loads((Path(__file__).resolve().parents[2] / "results/bench" / saved).read_text())
    assert len(rows) == 20 and {r["heads"] for r in rows} == {16, 128}
    assert {r.get("kv_b_proj", "bf16") for r in rows} == {kv_b_proj}
    for r in rows:
        prefix, new = [r["prefix"]] * r["requests"], [r["new"]] * r["requests"]
        absorbed, mha = extend.route_costs(prefix, new, r["heads"])
        assert absorbed * 1e6 == pytest.approx(r["predicted_absorbed_us"], rel=1e-9), r
        assert mha * 1e6 == pytest.approx(r["predicted_mha_us"], rel=1e-9), r
        picks = "absorbed" if extend.prefers_absorbed(prefix, new, r["heads"]) else "mha"
        faster = "absorbed" if r["snapmla_absorbed_us"] < r["snapmla_mha_us"] else "mha"
        assert picks == r["picks"] == r["faster"] == faster, r


def test_row_cap_and_pins(monkeypatch):
    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)
    many = [64] * (extend.ABSORBED_MAX_ROWS // (64 * 128) + 1)
    assert not extend.prefers_absorbed([8192] * len(many), many, 128), "above the row cap a batch stays on MHA"
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "absorbed")
    assert not extend.prefers_absorbed([8192] * len(many), many, 128), "the pin keeps the row cap"
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "mha")
    assert not extend.prefers_absorbed([4096] * 16, [128] * 16, 16)
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "absorbed")
    assert extend.prefers_absorbed([16384], [8192], 16)
    assert not extend.prefers_absorbed([0], [8192], 16), "without a prefix even the pin keeps MHA"
    monkeypatch.setenv("SNAPMLA_EXTEND_ROUTE", "fast")
    with pytest.raises(ValueError, match="SNAPMLA_EXTEND_ROUTE='fast': set it to 'auto' or 'mha' or 'absorbed'"):
        extend.prefers_absorbed([16], [16], 16)


def mla_attention(heads: int = 16, disabled: bool = False) -> SimpleNamespace:
    """The fields of a DeepSeek attention layer that SGLang's dispatch reads."""
    return SimpleNamespace(num_local_heads=heads, disable_chunked_prefix_cache=disabled,
                           chunked_prefix_cache_threshold=8192, flashinfer_mla_disable_ragged=False)


def dispatch_layers(backend, attn, fb, layers: int = 1) -> list:
    """What DeepSeek's model calls per layer: the dispatch handler registered for snapmla, with SGLang's forward
    context naming `backend` as the attention backend of the forward in progress. -> the layers' methods."""
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    previous = set_forward_context(ForwardContext(attn_backend=backend))
    try:
        return [handlers.AttentionBackendRegistry.get_handler("snapmla")(attn, fb) for _ in range(layers)]
    finally:
        set_forward_context(previous)


@pytest.fixture
def dispatch(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    from sglang_snapmla import plugin
    from sglang_snapmla.backend import SnapMLAForward

    plugin.register()
    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)

    def sglang_rule(attn, fb, name):  # SGLang's choice for flashmla outside captured prefill (it needs server args)
        prefix = sum(fb.extend_prefix_lens_cpu)
        if prefix == 0 or (prefix >= attn.chunked_prefix_cache_threshold and not attn.disable_chunked_prefix_cache):
            return AttnForwardMethod.MHA_ONE_SHOT if handlers._support_mha_one_shot(attn, fb, name) else \
                AttnForwardMethod.MHA_CHUNKED_KV
        return AttnForwardMethod.MLA

    monkeypatch.setattr(handlers, "_handle_attention_backend", sglang_rule)

    def run(prefix, ext, heads=16, mode=ForwardMode.EXTEND, disabled=False, layers=1, capacity=1 << 17):
        """One step as SGLang runs it: the backend's forward-metadata hook plans it, then each layer of the model
        asks the dispatch handler with SGLang's forward context naming the backend. -> the layers' methods (one
        when `layers` is 1)."""
        attn = mla_attention(heads, disabled)
        fb = SimpleNamespace(forward_mode=mode, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=ext,
                             seq_lens_cpu=torch.tensor([p + e for p, e in zip(prefix, ext)]),
                             req_pool_indices=torch.arange(len(ext)), get_max_chunk_capacity=lambda: capacity)
        backend = SnapMLAForward()
        backend.num_q_heads = heads
        # no pool here: the launches an absorbed route plans with the step (tests/product/test_backend.py) stay empty
        backend._plan_launches = lambda plan, heads, device: plan.launches.setdefault(heads, [])
        backend.plan_step(fb)
        methods = dispatch_layers(backend, attn, fb, layers)
        return methods[0] if layers == 1 else methods

    return run, AttnForwardMethod


def test_dispatch_applies_the_route_per_batch(dispatch):
    run, M = dispatch
    # SGLang's flashmla rule would say MHA here (prefixes sum to >= 8 192): the cost model says absorbed
    assert run([4096] * 16, [128] * 16) == M.MLA
    # ... and absorbed there (prefixes sum to < 8 192), where a long new span makes MHA cheaper
    assert run([4000], [4096]) == M.MHA_ONE_SHOT
    # ... in chunks of the prefix where the batch's keys exceed what one MHA pass may hold (SGLang's chunk capacity)
    assert run([4000], [4096], capacity=8000) == M.MHA_CHUNKED_KV
    assert run([0], [4096]) == M.MHA_ONE_SHOT  # a fresh prompt: SGLang's MHA prefill
    # the chunked prefix cache disabled: SGLang's absorbed path, whatever the cost
    assert run([4000], [4096], disabled=True) == M.MLA


def test_dispatch_keeps_sglangs_choice_in_captured_prefill(dispatch, monkeypatch):
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    from sglang.srt.model_executor.runner_backend_utils import breakable_cuda_graph

    run, M = dispatch
    monkeypatch.setattr(breakable_cuda_graph, "is_in_breakable_cuda_graph", lambda: True)  # as inside a capture
    monkeypatch.setattr(handlers, "_handle_attention_backend", lambda *a: M.MLA)  # SGLang pins MLA there
    assert run([4000], [4096]) == M.MLA
    assert run([0], [4096]) == M.MLA


def test_dispatch_keeps_sglangs_choice_for_speculative_extends(dispatch, monkeypatch):
    """Target verify and draft extend (MTP) extend the batch by draft tokens: their attention stays SGLang's choice
    (the decode kernel over the window), and no prefill route is asked for, whatever the lengths (a plain extend of
    the same lengths takes MHA)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    run, M = dispatch
    assert run([4000], [4096]) == M.MHA_ONE_SHOT
    monkeypatch.setattr(handlers, "_handle_attention_backend", lambda *a: M.MLA)
    unplanned = SimpleNamespace(extend_plan=lambda fb: pytest.fail(f"a prefill route asked for in {fb.forward_mode}"))
    drafts = [getattr(ForwardMode, name) for name in ("DRAFT_EXTEND", "DRAFT_EXTEND_V2") if hasattr(ForwardMode, name)]
    for mode in [ForwardMode.TARGET_VERIFY, *drafts]:
        fb = SimpleNamespace(forward_mode=mode, extend_prefix_lens_cpu=[4000], extend_seq_lens_cpu=[4096])
        assert dispatch_layers(unplanned, mla_attention(), fb) == [M.MLA], mode


def test_the_route_is_decided_once_per_step_by_the_metadata_hook(dispatch, monkeypatch):
    """Every layer of a step reads the route its plan holds: the cost model runs once per step (in the backend's
    forward-metadata hook), not once per layer, and a new step is decided again."""
    run, M = dispatch
    decided = []
    route = extend.prefers_absorbed
    monkeypatch.setattr(extend, "prefers_absorbed", lambda *a: decided.append(a) or route(*a))
    assert run([4096] * 16, [128] * 16, layers=27) == [M.MLA] * 27
    assert len(decided) == 1
    assert set(run([4000], [4096], layers=3)) <= {M.MHA_ONE_SHOT, M.MHA_CHUNKED_KV} and len(decided) == 2


def test_a_dispatch_without_a_snapmla_backend_in_the_forward_context_is_refused(dispatch, monkeypatch):
    from sglang_snapmla import plugin

    from sglang.srt.model_executor import forward_context

    monkeypatch.setattr(forward_context, "get_attn_backend", lambda: SimpleNamespace())
    with pytest.raises(RuntimeError, match="not a SnapMLA backend"):
        plugin._step_backend()
