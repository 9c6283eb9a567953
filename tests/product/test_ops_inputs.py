"""The public ops refuse malformed inputs with a SnapMLAInputError naming what is wrong, before any launch (a kernel
given them would read or write the wrong rows, or fault). Each case takes a well-formed call and breaks one thing."""

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
    "plan of another batch": (lambda: decode(plan=decode_plan.plan_decode(B + 1, 1, H, PAGES, torch.device(DEV),
                                                                           "triton")),
                              r"the decode plan is for \[batch, s_q, heads\] = \[3, 1, 16\]"),
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


def test_index_checks_refuse_a_negative_length(monkeypatch):
    monkeypatch.setenv(ops.CHECK_INDICES_ENV, "1")
    decode()  # well-formed: accepted
    with pytest.raises(ops.SnapMLAInputError, match=r"seq_lens must be >= 0, got \[100, -1\]"):
        decode(lens=torch.tensor([100, -1], dtype=torch.int32, device=DEV))
