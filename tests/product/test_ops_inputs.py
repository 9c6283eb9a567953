"""The public ops refuse malformed inputs with a SnapMLAInputError naming what is wrong, before any launch (a kernel
given them would read or write the wrong rows, or fault). Each case takes a well-formed call and breaks one thing."""

import dataclasses

import pytest
import torch

from sglang_snapmla import decode_plan, ops
from sglang_snapmla import numerics as nx

DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, H, PAGES = 2, 16, 2
N = B * PAGES * nx.PAGE_SIZE


def pool():
    return [torch.zeros(N, 512, dtype=nx.FP8_DTYPE, device=DEV), torch.ones(N, device=DEV),
            torch.zeros(N, 64, dtype=torch.bfloat16, device=DEV)]


def rows(t):
    return torch.zeros(t, 512, dtype=torch.bfloat16, device=DEV), torch.zeros(t, 64, dtype=torch.bfloat16, device=DEV)


def queries():
    return (torch.zeros(B, 1, H, 512, dtype=nx.FP8_DTYPE, device=DEV), torch.ones(B, 1, H, device=DEV),
            torch.zeros(B, 1, H, 64, dtype=torch.bfloat16, device=DEV))


def table():
    return torch.arange(B * PAGES, dtype=torch.int32, device=DEV).view(B, PAGES), \
        torch.full((B,), 100, dtype=torch.int32, device=DEV)


def wider(t, width):
    """t's values in a view whose rows are `width` apart (unit stride in the last dim, not contiguous)."""
    out = torch.zeros(*t.shape[:-1], width, dtype=t.dtype, device=t.device)
    out[..., :t.shape[-1]] = t
    return out[..., :t.shape[-1]]


def append(c_kv=None, k_rope=None, loc=None, kv=None):
    c, r = rows(3)
    ops.append_kv(c if c_kv is None else c_kv, r if k_rope is None else k_rope,
                  torch.arange(3, device=DEV) if loc is None else loc, *(kv or pool()))


def decode(q=None, bt=None, lens=None, kv=None, **kw):
    t, s = table()
    ops.decode_quantized(*(q or queries()), *(kv or pool()), t if bt is None else bt, s if lens is None else lens,
                         0.1, **kw)


def records(record_words=None, loc=None):
    loc = torch.arange(2, device=DEV) if loc is None else loc
    words = torch.zeros(2 * 161, dtype=torch.int32, device=DEV)
    ops.pool_to_records(words, torch.tensor([0, 161], device=DEV) if record_words is None else record_words, loc,
                        *pool())


def combine(splits):
    o_part = torch.zeros(B, H, 4, 512, device=DEV)
    ops.combine(o_part, torch.zeros(B, H, 4, device=DEV), torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=DEV),
                torch.empty(B, H, 1, device=DEV), H, 1, splits=splits)


def step(bt=None, lens=None, batch=B):
    t, s = table()
    plan = decode_plan.plan_decode(batch, 1, H, PAGES, torch.device(DEV), "triton")
    ops.check_decode_step(t if bt is None else bt, s if lens is None else lens, plan, N)


CASES = {
    "pool slots disagree": (lambda: append(kv=[pool()[0], pool()[1][:-1], pool()[2]]),
                            r"pool arrays disagree on slots: 256, 255, 256"),
    "pool not contiguous": (lambda: append(kv=[pool()[0], pool()[1], wider(pool()[2], 128)]),
                            "pool arrays must be contiguous"),
    "rope array of other slots": (lambda: append(kv=[pool()[0], pool()[1], pool()[2][:-1]]),
                                  r"pool arrays disagree on slots: 256, 256, 255"),
    "scales of two dims": (lambda: append(kv=[pool()[0], pool()[1].view(-1, 1), pool()[2]]),
                           r"kv_scale must have 1 dims, got shape \(256, 1\)"),
    "float slot ids": (lambda: append(loc=torch.arange(3, device=DEV).float()), r"loc must be \[3\] int32 or int64"),
    "fetch into rope rows of another width": (
        lambda: ops.fetch_dequant(torch.arange(2, device=DEV), *pool(),
                                  out_k_rope=torch.empty(2, 32, dtype=torch.bfloat16, device=DEV)),
        "out_k_rope last dim must be 64"),
    "loc of other rows": (lambda: append(loc=torch.arange(2, device=DEV)), r"loc must be \[3\] int32 or int64"),
    "k_rope of other rows": (lambda: append(k_rope=rows(2)[1]), "c_kv has 3 rows, k_rope 2"),
    "q_rope of other heads": (lambda: ops.quantize_q(rows(4)[0].view(2, 2, 512), rows(2)[1].view(2, 1, 64)),
                              r"disagree on \[T, H\]"),
    "q_nope strided": (lambda: ops.quantize_q(torch.zeros(2, 1, 512, 2, dtype=torch.bfloat16, device=DEV)[..., 0],
                                              rows(2)[1].view(2, 1, 64)),
                       "q_nope must be contiguous in its last dim"),
    "a tensor elsewhere": (lambda: append(loc=torch.arange(3, device="meta")), "all tensors must be on one device"),
    "record words of other rows": (lambda: records(record_words=torch.tensor([0], device=DEV)),
                                   r"record_words must be int64 and as long as loc \(\(2,\)\)"),
    "more splits than slots": (lambda: combine(5), "5 splits do not fit o_part's 4 slots"),
    "a negative split count": (lambda: combine(-1), "-1 splits do not fit o_part's 4 slots"),
    "table of another batch": (lambda: step(batch=B + 1), r"block_table must be \[B=3, max_pages\]"),
    "table strided": (lambda: step(bt=table()[0].t().contiguous().t()), "block_table must have unit stride"),
    "lengths of another batch": (lambda: step(lens=table()[1][:1]), r"seq_lens must be \[B=2\] int32"),
    "query scales of another batch": (lambda: decode(q=(queries()[0], queries()[1][:1], queries()[2])),
                                      r"q_scale \(1, 1, 16\), q_rope \(2, 1, 16, 64\) must agree"),
    "a plan and a split count": (lambda: decode(plan=decode_plan.plan_decode(B, 1, H, PAGES, torch.device(DEV),
                                                                             "triton"), num_splits=2),
                                 "pass either a plan or num_splits / tiling / impl, not both"),
    "plan of another batch": (lambda: decode(plan=decode_plan.plan_decode(B + 1, 1, H, PAGES, torch.device(DEV),
                                                                           "triton")),
                              r"the decode plan is for \[batch, s_q, heads\] = \[3, 1, 16\]"),
    "a flat table, unplanned": (lambda: decode(bt=table()[0].view(-1)), r"block_table must be \[B=2, max_pages\]"),
    "Q-quant rows not a power of two": (lambda: ops.quantize_q(rows(3)[0].view(1, 3, 512), rows(3)[1].view(1, 3, 64),
                                                               rows=3),
                                        "rows per program must be a power of two, got 3"),
    "queries without a batch dim": (lambda: ops.quantize_and_decode(rows(H)[0].view(1, H, 512),
                                                                    rows(H)[1].view(1, H, 64), *pool(), *table(),
                                                                    0.1),
                                    r"q_nope must be \[B, s_q, H, 512\], got \(1, 16, 512\)"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_malformed_input_is_refused_by_name(case):
    call, message = CASES[case]
    with pytest.raises(ops.SnapMLAInputError, match=message):
        call()


def test_the_triton_decode_writes_final_outputs_at_one_split_only():
    q8, qs, qr = queries()
    t, s = table()
    empty = torch.empty(0, device=DEV)
    with pytest.raises(ops.SnapMLAInputError, match="final outputs only with one split"):
        ops.launch_triton_decode(q8, qs, qr, *pool(), t, s, empty, empty,
                                 torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=DEV),
                                 torch.empty(B, H, 1, device=DEV), 0.1, splits=2)


def test_an_empty_batch_launches_nothing(monkeypatch):
    """B = 0 (an idle step): empty outputs and no launch (a CUDA grid of 0 blocks is a launch error)."""
    for name in ("launch_cuda_decode", "launch_triton_decode", "combine"):
        monkeypatch.setattr(ops, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} launched for an empty batch"))
    triton = decode_plan.plan_decode(0, 1, H, PAGES, torch.device(DEV), "triton")
    for plan in (triton, dataclasses.replace(triton, impl="cuda", splits=1), dataclasses.replace(triton, splits=2)):
        q8, qs, qr = (t[:0] for t in queries())
        out, lse = ops.decode_planned(q8, qs, qr, *pool(), table()[0][:0], table()[1][:0], 0.1, plan)
        assert out.shape == (0, 1, H, 512) and lse.shape == (0, H, 1)


@pytest.mark.parametrize("pdl, follows_q_quant", [(False, False), (True, False), (True, True)])
def test_the_cuda_launch_passes_its_flags_and_the_tables_storage(monkeypatch, pdl, follows_q_quant):
    """What the sm_90a decode is told besides its tensors: the launch flags (PDL; the lengths, table and first pages
    read before the wait, only right after the Q-quant) and the block table's entries to the end of its storage,
    not the view's width (a width-1 capture view of SGLang's table, replayed with longer sequences)."""
    from sglang_snapmla import cuda_ext

    seen = {}

    class Recorder:
        def decode_split(self, *args):
            seen["bt_entries"], seen["flags"] = args[-2], args[-1]

    monkeypatch.setattr(cuda_ext, "load", lambda: Recorder())
    t, s = table()
    wide = torch.zeros(B, 8, dtype=torch.int32, device=DEV)
    empty = torch.empty(0, device=DEV)
    out, lse = torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=DEV), torch.empty(B, H, 1, device=DEV)
    ops.launch_cuda_decode(*queries(), *pool(), wide[:, :1], s, empty, empty, out, lse, 0.1, splits=1, pdl=pdl,
                           follows_q_quant=follows_q_quant)
    assert seen["bt_entries"] == B * 8
    assert seen["flags"] == (ops.CUDA_LAUNCH_FLAGS["kLaunchPdl"] if pdl else 0) | (
        ops.CUDA_LAUNCH_FLAGS["kLaunchKvBeforeWait"] if follows_q_quant else 0)


def test_tensors_off_the_gpu_are_refused_outside_the_interpreter(monkeypatch):
    """On CPU the kernels run only under Triton's interpreter (the tests); elsewhere a CPU tensor is refused by name
    before any launch."""
    monkeypatch.setattr(ops, "interpreter_mode", lambda: False)
    c, r = rows(1)
    with pytest.raises(ops.SnapMLAInputError, match=r"SnapMLA kernels need CUDA tensors \(got cpu\)"):
        ops.quantize_q(c.cpu().view(1, 1, 512), r.cpu().view(1, 1, 64))
    # the step's own checks, which the backend runs once a step apart from every layer's decode
    t, s = table()
    with pytest.raises(ops.SnapMLAInputError, match=r"SnapMLA kernels need CUDA tensors \(got cpu\)"):
        step(bt=t.cpu(), lens=s.cpu())


def test_the_tables_entries_count_from_the_views_first_element():
    """The CUDA decode's bound on block-table reads (and the index checks' storage) starts at the view's first
    element: a view that starts at row 1 (a later batch's table in one allocation) has one row fewer to read."""
    wide = torch.zeros(3, 8, dtype=torch.int32, device=DEV)
    assert ops.block_table_entries(wide) == 24
    assert ops.block_table_entries(wide[1:, :2]) == 16
    assert ops.block_table_entries(wide[2:, 3:]) == 5


def test_index_checks_refuse_a_negative_page_id(monkeypatch):
    monkeypatch.setenv(ops.CHECK_INDICES_ENV, "1")
    t, s = table()
    t[1, 1] = -1
    with pytest.raises(ops.SnapMLAInputError, match=r"sequence 1 uses page ids in \[-1, 2\], outside the pool's"):
        decode(bt=t)


def test_index_checks_refuse_a_negative_length(monkeypatch):
    monkeypatch.setenv(ops.CHECK_INDICES_ENV, "1")
    decode()  # well-formed: accepted
    with pytest.raises(ops.SnapMLAInputError, match=r"seq_lens must be >= 0, got \[100, -1\]"):
        decode(lens=torch.tensor([100, -1], dtype=torch.int32, device=DEV))


def test_the_plan_lets_the_64_row_kernel_quantize_q(monkeypatch):
    """`DecodePlan.q_in_decode` with SNAPMLA_Q_IN_DECODE=1 wherever the sm_90a 64-row kernel runs (more than 32 query
    rows a sequence), off by default; never for the narrow kernel or the Triton decode, and asked for there, refused
    by name."""
    dev = torch.device(DEV)
    monkeypatch.setattr(decode_plan, "decode_impl", lambda requested=None: requested or "cuda")
    assert not decode_plan.plan_decode(4, 1, 128, 8, dev).q_in_decode
    assert decode_plan.plan_decode(4, 1, 128, 8, dev, q_in_decode=True).q_in_decode
    monkeypatch.setenv("SNAPMLA_Q_IN_DECODE", "1")
    assert decode_plan.plan_decode(4, 1, 128, 8, dev).q_in_decode
    assert decode_plan.plan_decode(4, 3, 16, 8, dev).q_in_decode  # 48 rows: the 64-row kernel
    assert not decode_plan.plan_decode(4, 2, 16, 8, dev).q_in_decode  # 32 rows: the narrow kernel
    assert not decode_plan.plan_decode(4, 1, 128, 8, dev, "triton").q_in_decode
    assert not decode_plan.plan_decode(4, 1, 128, 8, dev, q_in_decode=False).q_in_decode
    for heads, want in ((16, "cuda"), (128, "triton")):
        with pytest.raises(ops.SnapMLAInputError, match="only by the sm_90a 64-row kernel"):
            decode_plan.plan_decode(4, 1, heads, 8, dev, want, q_in_decode=True)


@pytest.mark.parametrize("layout", ["contiguous", "head_major", "misaligned"])
def test_q_in_decode_hands_the_kernel_the_bf16_rows(monkeypatch, caplog, layout):
    """With `plan.q_in_decode` the 64-row kernel gets q_nope / q_rope as they are (no Q-quant launch, their strides
    passed on, never told it follows the Q-quant) and the block table's entries to the end of its storage (not the
    width of the view: SGLang's width-1 capture view); rows it cannot load (a q_nope row stride that is not a
    multiple of 16 bytes) take the Q-quant kernel and the quantized decode, logged once per layout."""
    from sglang_snapmla import cuda_ext

    seen = []

    class Recorder:
        def decode_split(self, *args):
            seen.append(("decode_split", args))

        def decode_split_q_bf16(self, *args):
            seen.append(("decode_split_q_bf16", args))

    monkeypatch.setattr(cuda_ext, "load", lambda: Recorder())
    quantized = []
    quantize_q = ops.quantize_q
    monkeypatch.setattr(ops, "quantize_q", lambda *a: quantized.append(a) or quantize_q(*a))
    heads, s_q = 48, 2
    T = B * s_q
    monkeypatch.setattr(ops, "_q_layouts_refused", set())
    bf16 = lambda *shape: torch.randn(*shape).to(torch.bfloat16).to(DEV)  # noqa: E731
    q_nope = {"contiguous": lambda: bf16(T, heads, 512),
              "head_major": lambda: bf16(heads, T, 512).transpose(0, 1),  # SGLang's absorbed BMM output
              "misaligned": lambda: wider(bf16(T, heads, 512), 516)}[layout]()
    q_rope = torch.zeros(T, heads, 576, dtype=torch.bfloat16, device=DEV)[..., 512:]  # a slice, as SGLang's q_pe
    plan = dataclasses.replace(decode_plan.plan_decode(B, s_q, heads, PAGES, torch.device(DEV), "triton", 1),
                               impl="cuda", q_in_decode=True, pdl=True)
    t, s = table()
    wide = torch.zeros(B, 8, dtype=torch.int32, device=DEV)
    wide[:, :PAGES] = t
    for _ in range(2):
        ops.quantize_and_decode_planned(q_nope, q_rope, *pool(), wide[:, :1], s, 0.1, plan)
    if layout == "misaligned":
        assert [name for name, _ in seen] == ["decode_split"] * 2 and len(quantized) == 2
        assert seen[0][1][-1] == ops.CUDA_LAUNCH_FLAGS["kLaunchPdl"] | ops.CUDA_LAUNCH_FLAGS["kLaunchKvBeforeWait"]
        assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
        assert "runs the Q-quant kernel first" in caplog.records[0].message
        return
    assert [name for name, _ in seen] == ["decode_split_q_bf16"] * 2 and not quantized
    args = seen[0][1]
    assert args[0] is q_nope and args[1] is q_rope
    assert args[11:14] == (s_q * heads, heads, s_q)  # R, H, S_Q
    assert args[-2] == B * 8  # the table's storage from its first element
    assert args[-1] == ops.CUDA_LAUNCH_FLAGS["kLaunchPdl"]  # never kLaunchKvBeforeWait
