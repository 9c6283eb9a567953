"""What a serving pool holds besides the sequences' keys, against every kernel that reads it (CPU: Triton under the
interpreter; on a GPU also the sm_90a decode):

* stale bytes: slots at or past a sequence's end (the tail of its last page, a reused page) and block-table entries
  past its pages hold anything -- NaN, infinities, other pages' ids. No output may depend on them.
* rows without a visible key (padding rows with seq_len < s_q, seq_len 0): out 0, LSE -inf at any split count.
* non-finite keys and queries (numerics.quantize_with_scale's policy): the rows that see them are NaN, nothing else
  changes, and a page reused after them is clean.
"""

import math

import pytest
import torch

from helpers import assert_close, garbage_table_tail, paged_problem, poison_unwritten
from sglang_snapmla import numerics as nx
from sglang_snapmla import decode_plan, ops

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 576**-0.5
# the CUDA decode runs on sm_90 only; elsewhere (and on CPU) the Triton decode is the one to check
IMPLS = ["triton", "cuda"] if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) else [
    "triton"]

# (seq_lens, heads, s_q): lengths at and around page edges, odd head counts, draft windows
STALE_CASES = [
    ([1, 63, 64, 65], 3, 1),
    ([1000, 5], 16, 2),
    ([65, 130, 3], 16, 3),
]
if torch.cuda.is_available():
    STALE_CASES += [([4097, 1000, 1, 63], 128, 1), ([1000, 64, 65], 128, 3), ([4097, 2], 16, 2)]


def _problem(gen, seq_lens, heads, s_q):
    """A paged problem on DEV with its kernel-written pool: (q8, q_scale, q_rope', [kv_content, kv_scale, kv_rope],
    block_table, seq_lens)."""
    p = paged_problem(gen, seq_lens, heads, s_q=s_q)
    B = len(seq_lens)
    qn = p["q_nope"].to(torch.bfloat16).to(DEV).flatten(0, 1)
    qr = p["q_rope"].to(torch.bfloat16).to(DEV).flatten(0, 1)
    q8, qs, qra = (t.unflatten(0, (B, s_q)) for t in ops.quantize_q(qn, qr))
    kv = list(ops.pool_from_rows(p["c_kv"].to(torch.bfloat16).to(DEV), p["k_rope"].to(torch.bfloat16).to(DEV)))
    return q8, qs, qra, kv, p["block_table"].to(DEV), p["seq_lens"].to(DEV)


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seq_lens,heads,s_q", STALE_CASES)
def test_stale_slots_and_table_tails_change_no_output(gen, seq_lens, heads, s_q, impl, splits):
    q8, qs, qr, kv, bt, lens = _problem(gen, seq_lens, heads, s_q)
    # the default split count follows the table's width (wider below): fix it so that both runs use the same
    splits = splits or decode_plan.plan_decode(len(seq_lens), s_q, heads, bt.shape[1], q8.device, impl).splits
    clean, clean_lse = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    assert torch.isfinite(clean).all()
    poison_unwritten(*kv, bt, lens, gen)
    stale_bt = garbage_table_tail(bt, lens, gen)
    out, lse = ops.decode_quantized(q8, qs, qr, *kv, stale_bt, lens, SCALE, num_splits=splits, impl=impl)
    assert torch.equal(out, clean), f"stale bytes changed the output ({impl}, splits {splits})"
    assert torch.equal(lse, clean_lse)
    # ... and the spec ignores them too
    q = nx.QuantizedQuery(q8.cpu(), qs.cpu(), qr.cpu())
    ref, ref_lse = nx.snapmla_decode_reference(q, nx.LatentCache(*(t.cpu() for t in kv)), stale_bt.cpu(), lens.cpu(),
                                               SCALE)
    assert_close(out.float().cpu(), ref, rel_l2=4e-2, what=f"{impl} vs reference over a stale pool")


@pytest.mark.skipif(DEV != "cpu", reason="reads are recorded by Triton's CPU interpreter")
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_the_decode_reads_no_table_entry_past_a_sequences_pages(gen, splits):
    """The Triton decode reads block-table entries 0 .. ceil(seq_len / 64) - 1 of each row and no other, also where a
    sequence's last page is full and is the table's last column: the table is a narrowed view (as under CUDA graphs)
    whose storage goes on with live page ids of other sequences, so a read past a row's pages would not crash but
    is seen here (the reads are recorded by the interpreter)."""
    from triton_cpu import elements_read, recorded_loads

    seq_lens, heads = [128, 64, 1, 65], 3
    q8, qs, qr, kv, bt, lens = _problem(gen, seq_lens, heads, 1)
    B, P = bt.shape  # P = 2: the longest sequences' pages; the 128-token one fills both
    storage = torch.empty(B, P + 2, dtype=torch.int32)
    storage[:] = int(bt.max())  # live pages of other sequences past every row's end
    storage[:, :P] = bt
    view = storage[:, :P]
    with recorded_loads() as loads:
        ops.decode_quantized(q8, qs, qr, *kv, view, lens, SCALE, num_splits=splits, impl="triton")
    read = {(i // storage.stride(0), i % storage.stride(0)) for i in elements_read(loads, storage)}
    allowed = {(b, c) for b, n in enumerate(seq_lens) for c in range(math.ceil(n / 64))}
    assert read == allowed, f"entries read past a sequence's pages: {sorted(read - allowed)}"


def test_fetch_dequant_reads_only_the_requested_rows(gen):
    p = paged_problem(gen, [130], 1)
    kv = list(ops.pool_from_rows(p["c_kv"].to(torch.bfloat16).to(DEV), p["k_rope"].to(torch.bfloat16).to(DEV)))
    bt, lens = p["block_table"].to(DEV), p["seq_lens"].to(DEV)
    loc = nx.gather_sequence(p["block_table"][0], 130).to(DEV)
    clean = ops.fetch_dequant(loc, *kv)
    poison_unwritten(*kv, bt, lens, gen)
    for got, want in zip(ops.fetch_dequant(loc, *kv), clean):
        assert torch.equal(got, want)


@pytest.mark.parametrize("splits", [None, 1, 2, 4])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("H", [4, 16])
def test_rows_without_a_visible_key_are_zero_with_lse_minus_inf(gen, impl, splits, H):
    """Padding rows: lengths below the draft window (query token i sees keys [0, seq_len - s_q + i]) and length 0.
    12 and 48 query rows a sequence: the sm_90a decode's narrow kernel and its 64-row one."""
    s_q = 3
    lens_list = [0, 1, 2, 70, 200]
    q8, qs, qr, kv, bt, lens = _problem(gen, [max(n, 1) for n in lens_list], H, s_q)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=DEV)
    poison_unwritten(*kv, bt, lens, gen)
    out, lse = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    ref, ref_lse = nx.snapmla_decode_reference(nx.QuantizedQuery(q8.cpu(), qs.cpu(), qr.cpu()),
                                               nx.LatentCache(*(t.cpu() for t in kv)), bt.cpu(), lens.cpu(), SCALE)
    for b, n in enumerate(lens_list):
        for i in range(s_q):
            no_key = n - s_q + i < 0
            rows, row_lse = out[b, i].float().cpu(), lse[b, :, i].cpu()
            if no_key:
                assert torch.equal(rows, torch.zeros_like(rows)), f"b {b} token {i}: a keyless row is not 0"
                assert torch.equal(row_lse, torch.full_like(row_lse, -math.inf))
                assert torch.equal(ref[b, i], torch.zeros_like(ref[b, i]))
                assert torch.equal(ref_lse[b, :, i], torch.full_like(row_lse, -math.inf))
            else:
                assert_close(rows, ref[b, i], rel_l2=4e-2, what=f"b {b} token {i}")


# ---------------------------------------------------------------------------------------------------------------
# Non-finite keys and queries
# ---------------------------------------------------------------------------------------------------------------
def _nonfinite_rows(gen, T):
    c = torch.randn(T, 512, generator=gen) * 3
    r = torch.randn(T, 64, generator=gen) * 3
    c[1, 7], c[2, 0], r[3, 5], r[4, 63], c[5, 100] = math.nan, math.inf, math.nan, -math.inf, -math.inf
    return c.to(torch.bfloat16), r.to(torch.bfloat16)


@pytest.mark.parametrize("q_rows", [None, 1, 4])
def test_nonfinite_rows_quantize_to_zero_content_and_nan_scale(gen, q_rows):
    c, r = _nonfinite_rows(gen, 8)
    ref = nx.quantize_kv(c, r)
    assert torch.isnan(ref.scale[1:6]).all() and torch.isfinite(ref.scale[[0, 6, 7]]).all()
    assert (ref.content[1:6].float() == 0).all() and (ref.rope[1:6].float() == 0).all()
    kv = [torch.empty(8, 512, dtype=nx.FP8_DTYPE, device=DEV), torch.empty(8, device=DEV),
          torch.empty(8, 64, dtype=torch.bfloat16, device=DEV)]
    ops.append_kv(c.to(DEV), r.to(DEV), torch.arange(8, device=DEV), *kv)
    assert torch.equal(kv[0].cpu().view(torch.uint8), ref.content.view(torch.uint8))
    assert torch.allclose(kv[1].cpu(), ref.scale, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(kv[2].cpu().view(torch.int16), ref.rope.view(torch.int16))
    # queries: one scale per (token, head); with 4 rows a program, finite and non-finite rows share a block
    qn, qr = c.view(2, 4, 512), r.view(2, 4, 64)
    q8, qs, qra = ops.quantize_q(qn.to(DEV), qr.to(DEV), rows=q_rows)
    qref = nx.quantize_q(qn, qr)
    assert torch.allclose(qs.cpu(), qref.scale, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(q8.cpu().view(torch.uint8), qref.content.view(torch.uint8))
    assert torch.equal(qra.cpu().view(torch.int16), qref.rope.view(torch.int16))


def _append_nan_key(gen, kv, bt, seq: int, key: int, dim: int) -> torch.Tensor:
    """Writes key `key` of sequence `seq` through the K-append with a NaN at latent dim `dim` (stored as content 0,
    scale NaN); returns its slot [1]."""
    loc = (bt[seq, key // 64].long() * 64 + key % 64).view(1)
    bad_k = torch.randn(1, 512, generator=gen).to(torch.bfloat16)
    bad_k[0, dim] = math.nan
    ops.append_kv(bad_k.to(DEV), torch.randn(1, 64, generator=gen).to(torch.bfloat16).to(DEV), loc, *kv)
    return loc


def _assert_the_specs_nan_pattern(out, q8, qs, qr, kv, bt, lens):
    """The spec's decode of the same quantized query and pool is NaN exactly where `out` is."""
    ref, _ = nx.snapmla_decode_reference(nx.QuantizedQuery(q8.cpu(), qs.cpu(), qr.cpu()),
                                         nx.LatentCache(*(t.cpu() for t in kv)), bt.cpu(), lens.cpu(), SCALE)
    assert torch.equal(torch.isnan(ref), torch.isnan(out.float().cpu())), "the spec's NaN rows differ"


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_nonfinite_key_or_query_stays_in_its_request(gen, impl, splits):
    """Request 1 appends a NaN key (visible to all its rows), request 2 has one non-finite query head. Their rows
    that see it are NaN; request 0, request 2's other heads, and request 3 -- whose last page is the page request 1
    wrote, reused, with the NaN key past request 3's end -- are bitwise what they were without them."""
    H, s_q = 4, 1
    q8, qs, qr, kv, bt, lens = _problem(gen, [130, 200, 90, 70], H, s_q)
    # request 3's second page becomes request 1's third page (keys 128..191 of request 1, 64..127 of request 3)
    bt[3, 1] = bt[1, 2]
    lens[3] = 64 + 10  # request 3 ends at offset 10 of that page
    clean, _ = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    # request 1's key 168 (offset 40 of its third page) < 200: visible to request 1; past request 3's end
    _append_nan_key(gen, kv, bt, seq=1, key=168, dim=3)
    # request 2, head 2: the quantized form of a query holding an infinity (test above)
    q8[2, 0, 2], qs[2, 0, 2], qr[2, 0, 2] = 0.0, math.nan, 0.0
    out, lse = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    assert torch.isnan(out[1].float()).all() and torch.isnan(lse[1]).all(), "rows seeing a NaN key must be NaN"
    assert torch.isnan(out[2, 0, 2].float()).all() and torch.isnan(lse[2, 2]).all()
    assert torch.equal(out[0], clean[0]) and torch.equal(out[3], clean[3])
    others = [h for h in range(H) if h != 2]
    assert torch.equal(out[2, 0, others], clean[2, 0, others])
    _assert_the_specs_nan_pattern(out, q8, qs, qr, kv, bt, lens)


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("nan_key", [129, 128])
def test_a_nonfinite_key_in_a_draft_window_reaches_only_the_tokens_that_see_it(gen, impl, splits, nan_key):
    """A verify window of 3 tokens over 130 keys: token t sees keys 0..127 + t. A draft token's key with a NaN (its
    scale NaN, written in the pool) is written but causally hidden from the window's earlier tokens: their rows are
    bitwise what they were without it, even where the page holding it has no key they see (key 129: token 0 sees none
    of page 2); the tokens that see it are NaN, as in the spec."""
    H, s_q = 4, 3
    q8, qs, qr, kv, bt, lens = _problem(gen, [130, 70], H, s_q)
    clean, clean_lse = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    loc = _append_nan_key(gen, kv, bt, seq=0, key=nan_key, dim=100)
    assert torch.isnan(kv[1][loc]).all()
    out, lse = ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE, num_splits=splits, impl=impl)
    first_seeing = nan_key - (130 - s_q)  # the first window token whose keys reach nan_key
    assert torch.equal(out[0, :first_seeing], clean[0, :first_seeing]), "a hidden NaN key changed an earlier token"
    assert torch.equal(lse[0, :, :first_seeing], clean_lse[0, :, :first_seeing])
    assert torch.isnan(out[0, first_seeing:].float()).all() and torch.isnan(lse[0, :, first_seeing:]).all()
    assert torch.equal(out[1], clean[1])
    _assert_the_specs_nan_pattern(out, q8, qs, qr, kv, bt, lens)


# ---------------------------------------------------------------------------------------------------------------
# Opt-in index checks
# ---------------------------------------------------------------------------------------------------------------
def test_index_checks_reject_what_would_read_or_write_outside_the_pool(gen, monkeypatch):
    monkeypatch.setenv(ops.CHECK_INDICES_ENV, "1")
    q8, qs, qr, kv, bt, lens = _problem(gen, [70, 130], 2, 1)
    n = kv[0].shape[0]
    ops.decode_quantized(q8, qs, qr, *kv, bt, lens, SCALE)  # in range: accepted
    rows = torch.zeros(1, 512, dtype=torch.bfloat16, device=DEV), torch.zeros(1, 64, dtype=torch.bfloat16, device=DEV)
    for bad in (n, -1):
        with pytest.raises(ops.SnapMLAInputError, match="outside the pool"):
            ops.append_kv(*rows, torch.tensor([bad], device=DEV), *kv)
        with pytest.raises(ops.SnapMLAInputError, match="outside the pool"):
            ops.fetch_dequant(torch.tensor([0, bad], device=DEV), *kv)
        # HiCache's record moves, both ways (two 644-byte records, 161 int32 words each)
        words, record_words = torch.zeros(2 * 161, dtype=torch.int32, device=DEV), torch.tensor([0, 161], device=DEV)
        for move in (ops.pool_to_records, ops.records_to_pool):
            with pytest.raises(ops.SnapMLAInputError, match="outside the pool"):
                move(words, record_words, torch.tensor([0, bad], device=DEV), *kv)
    wrong_page = bt.clone()
    wrong_page[1, 2] = n // 64  # one past the last page
    with pytest.raises(ops.SnapMLAInputError, match="sequence 1 uses page ids"):
        ops.decode_quantized(q8, qs, qr, *kv, wrong_page, lens, SCALE)
    too_long = lens.clone()
    too_long[1] = 64 * bt.shape[1] + 1  # one entry more than the table's storage holds from row 1
    with pytest.raises(ops.SnapMLAInputError, match="needs 4 block-table entries"):
        ops.decode_quantized(q8, qs, qr, *kv, bt, too_long, SCALE)
    with pytest.raises(ops.SnapMLAInputError, match=">= 0"):
        ops.decode_quantized(q8, qs, qr, *kv, bt, -lens, SCALE)
    # a narrowed view reads past its width into the table's storage (SGLang's capture view): accepted
    ops.decode_quantized(q8, qs, qr, *kv, bt[:, :1], lens, SCALE, num_splits=1)
