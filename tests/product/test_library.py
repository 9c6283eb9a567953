"""The typed ops (sglang_snapmla/library.py): registered with torch.library as their schemas say, fake
implementations that agree with the kernels' outputs, and a decode step that torch.compile traces as one graph with
the same outputs as eager (on the CPU: Triton's interpreter behind the ops, `aot_eager` as the compiler backend)."""

import dataclasses

import pytest
import torch

from sglang_snapmla import decode_plan, library, ops
from sglang_snapmla import numerics as nx

pytestmark = pytest.mark.cpu_interpreter  # CPU tensors, the Triton kernels in the interpreter


def pool(gen, pages: int):
    n = pages * nx.PAGE_SIZE
    c_kv = torch.randn(n, nx.KV_LORA_RANK, generator=gen).to(torch.bfloat16)
    k_rope = (4 * torch.randn(n, nx.ROPE_DIM, generator=gen)).to(torch.bfloat16)
    return ops.pool_from_rows(c_kv, k_rope)


def queries(gen, tokens: int, heads: int):
    return (torch.randn(tokens, heads, nx.KV_LORA_RANK, generator=gen).to(torch.bfloat16),
            torch.randn(tokens, heads, nx.ROPE_DIM, generator=gen).to(torch.bfloat16))


def paging(gen, batch: int, pages: int):
    """Each sequence over its own shuffled pages, lengths of one page and more."""
    table = torch.stack([torch.randperm(pages, generator=gen) for _ in range(batch)]).to(torch.int32)
    lens = torch.randint(1, pages * nx.PAGE_SIZE + 1, (batch,), generator=gen).to(torch.int32)
    return table, lens


# opcheck's fake-tensor test: the fake implementation's outputs match the op's (shape, dtype, strides, device). Its
# schema test reads every tensor with ops CPU torch lacks for float8; what the ops write is checked below instead.
OPCHECK = ("test_faketensor",)


def written_arguments(op) -> list[str]:
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def bits(t: torch.Tensor) -> torch.Tensor:
    """What torch.equal compares: float8 as its bytes (CPU torch has no float8 comparison)."""
    return t.view(torch.uint8) if t.dtype == nx.FP8_DTYPE else t


def snapshot(tensors) -> list[torch.Tensor]:
    return [bits(t).clone() for t in tensors]


def assert_unchanged(before, tensors):
    for b, t in zip(before, tensors):
        assert torch.equal(b, bits(t))


def test_quantize_q_and_fetch_dequant_opcheck(gen):
    q_nope, q_rope = queries(gen, 3, 16)
    before = snapshot((q_nope, q_rope))
    torch.library.opcheck(torch.ops.snapmla.quantize_q.default, (q_nope, q_rope), test_utils=OPCHECK)
    assert_unchanged(before, (q_nope, q_rope))
    arrays = pool(gen, 2)
    loc = torch.tensor([5, 70, 3], dtype=torch.int64)
    before = snapshot(arrays)
    torch.library.opcheck(torch.ops.snapmla.fetch_dequant.default, (loc, *arrays), test_utils=OPCHECK)
    assert_unchanged(before, arrays)
    assert written_arguments(torch.ops.snapmla.quantize_q.default) == []
    assert written_arguments(torch.ops.snapmla.fetch_dequant.default) == []


def test_append_kv_opcheck_declares_what_it_writes(gen):
    """The schema marks the three pool arrays as written (and nothing else): a compiler may then neither drop the
    call, which returns nothing, nor move reads of the pool across it. The rows it writes are the spec's."""
    assert written_arguments(torch.ops.snapmla.append_kv.default) == ["kv_content", "kv_scale", "kv_rope"]
    arrays = pool(gen, 2)
    c_kv = torch.randn(4, nx.KV_LORA_RANK, generator=gen).to(torch.bfloat16)
    k_rope = torch.randn(4, nx.ROPE_DIM, generator=gen).to(torch.bfloat16)
    loc = torch.tensor([1, 64, 9, 100], dtype=torch.int64)
    torch.library.opcheck(torch.ops.snapmla.append_kv.default, (c_kv, k_rope, loc, *arrays), test_utils=OPCHECK)
    torch.ops.snapmla.append_kv(c_kv, k_rope, loc, *arrays)
    expected = ops.pool_from_rows(c_kv, k_rope)
    for got, want in zip(arrays, expected):
        assert torch.equal(bits(got[loc]), bits(want))


HEADS = 16


def decode_problem(gen, batch: int, s_q: int, splits: int, pages: int = 3):
    """A small paged decode problem: bf16 queries [batch * s_q, 16, 512] / [.., 64], the pool of `pages` pages, a
    block table and lengths of at least s_q, and the plan with `splits` splits."""
    arrays = pool(gen, pages)
    table, lens = paging(gen, batch, pages)
    q = queries(gen, batch * s_q, HEADS)
    plan = decode_plan.plan_decode(batch, s_q, HEADS, pages, q[0].device, num_splits=splits)
    return q, arrays, table, lens.clamp(min=s_q), plan


@pytest.mark.parametrize("batch,s_q,splits", [(2, 1, 1), (3, 2, 3)])
def test_decode_opcheck(gen, batch, s_q, splits):
    q, arrays, table, lens, plan = decode_problem(gen, batch, s_q, splits)
    q8, q_scale, q_rope = ops.quantize_q(*q)
    args = (q8.view(batch, s_q, HEADS, -1), q_scale.view(batch, s_q, HEADS), q_rope.view(batch, s_q, HEADS, -1),
            *arrays, table, lens, 0.1, plan.impl, plan.splits, plan.slots, plan.pdl, [], False)
    before = snapshot(args[:8])
    torch.library.opcheck(torch.ops.snapmla.decode.default, args, test_utils=OPCHECK)
    assert_unchanged(before, args[:8])
    assert written_arguments(torch.ops.snapmla.decode.default) == []
    out, lse = torch.ops.snapmla.decode(*args)
    want_out, want_lse = ops.decode_quantized(*args[:9], plan=plan)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("batch,s_q,splits", [(2, 1, 1), (3, 2, 3)])
def test_quantize_and_decode_opcheck(gen, batch, s_q, splits):
    q, arrays, table, lens, plan = decode_problem(gen, batch, s_q, splits)
    args = (*q, *arrays, table, lens, 0.1, s_q, plan.impl, plan.splits, plan.slots, plan.pdl, [], plan.q_in_decode)
    before = snapshot(args[:7])
    torch.library.opcheck(torch.ops.snapmla.quantize_and_decode.default, args, test_utils=OPCHECK)
    assert_unchanged(before, args[:7])
    assert written_arguments(torch.ops.snapmla.quantize_and_decode.default) == []
    out, lse = torch.ops.snapmla.quantize_and_decode(*args)
    want_out, want_lse = ops.quantize_and_decode(q[0].view(batch, s_q, HEADS, -1), q[1].view(batch, s_q, HEADS, -1),
                                                 *arrays, table, lens, 0.1, num_splits=splits)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_a_decode_step_compiles_to_one_graph_with_eagers_outputs(gen, monkeypatch):
    """Append the step's new keys, fetch some rows back, Q-quant and decode: torch.compile(fullgraph=True) must trace
    it without a graph break (a plain call into `ops` breaks it: Dynamo would trace the launch code) and compute what
    the eager calls compute, bit for bit. Both reach the decode with the same plan (split count, partial slots, PDL,
    tiling) and the same follows-Q-quant flag: the typed op passes each of them on."""
    batch, heads, pages = 3, 16, 4
    launches = []
    decode_planned = ops.decode_planned

    def recording(*args):  # args[-2:]: the plan and follows_q_quant; run without PDL (Triton's interpreter)
        launches.append(args[-2:])
        return decode_planned(*args[:-2], dataclasses.replace(args[-2], pdl=False), args[-1])

    monkeypatch.setattr(ops, "decode_planned", recording)
    gen_state = gen.get_state()

    def inputs():
        gen.set_state(gen_state)
        arrays = pool(gen, pages)
        table, lens = paging(gen, batch, pages)
        new_k = torch.randn(batch, nx.KV_LORA_RANK, generator=gen).to(torch.bfloat16)
        new_rope = torch.randn(batch, nx.ROPE_DIM, generator=gen).to(torch.bfloat16)
        loc = (table[:, 0].long() * nx.PAGE_SIZE + (lens.long() - 1) % nx.PAGE_SIZE)  # each sequence's last slot
        return arrays, table, lens, new_k, new_rope, loc, queries(gen, batch, heads)

    plan = dataclasses.replace(decode_plan.plan_decode(batch, 1, heads, pages, torch.device("cpu"), num_splits=2,
                                                       tiling=(16, 4, 1)), pdl=True)

    def step(arrays, table, lens, new_k, new_rope, loc, q):
        library.append_kv(new_k, new_rope, loc, *arrays)
        fetched = library.fetch_dequant(loc, *arrays)
        q8, q_scale, q_rope = library.quantize_q(*q)
        out, lse = library.decode(q8.view(batch, 1, heads, -1), q_scale.view(batch, 1, heads),
                                  q_rope.view(batch, 1, heads, -1), *arrays, table, lens, 0.1, plan,
                                  follows_q_quant=True)
        both = library.quantize_and_decode(*q, *arrays, table, lens, 0.1, plan)  # the backend's one call
        return out, lse, *both, *fetched

    eager_in = inputs()
    eager = step(*eager_in)
    compiled_in = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled_in)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert launches == [(plan, True)] * 4, launches
    for a, b in zip(eager_in[0], compiled_in[0]):  # the pool writes happened in the compiled step too
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_eager_calls_reach_ops_without_the_dispatcher(gen, monkeypatch):
    """Outside a trace each function calls `ops` directly: a custom op's dispatch costs tens of microseconds of host
    time per call, which eager prefill would pay per layer (library.py). The typed ops are replaced by failures here."""
    for name in ("quantize_q", "decode", "quantize_and_decode", "append_kv", "fetch_dequant"):
        getattr(torch.ops.snapmla, name)  # resolved first, so that monkeypatch restores the real one
        monkeypatch.setattr(torch.ops.snapmla, name,
                            lambda *a, _name=name, **k: pytest.fail(f"an eager {_name} went through the dispatcher"))
    batch, heads, pages = 2, 16, 2
    arrays = pool(gen, pages)
    table, lens = paging(gen, batch, pages)
    loc = torch.tensor([0, 1])
    library.append_kv(torch.randn(2, nx.KV_LORA_RANK, generator=gen).to(torch.bfloat16),
                      torch.randn(2, nx.ROPE_DIM, generator=gen).to(torch.bfloat16), loc, *arrays)
    library.fetch_dequant(loc, *arrays)
    q8, q_scale, q_rope = library.quantize_q(*queries(gen, batch, heads))
    plan = decode_plan.plan_decode(batch, 1, heads, pages, torch.device("cpu"), num_splits=1, tiling=(16, 4, 1))
    out, _ = library.decode(q8.view(batch, 1, heads, -1), q_scale.view(batch, 1, heads),
                            q_rope.view(batch, 1, heads, -1), *arrays, table, lens, 0.1, plan)
    assert out.shape == (batch, 1, heads, nx.KV_LORA_RANK)
    out, _ = library.quantize_and_decode(*queries(gen, batch, heads), *arrays, table, lens, 0.1, plan)
    assert out.shape == (batch, 1, heads, nx.KV_LORA_RANK)
