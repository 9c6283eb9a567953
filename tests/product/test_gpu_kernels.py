"""GPU-size checks of the kernels (`pytest -m gpu` on the Hopper host; skipped without CUDA). Decode runs twice:
Triton, and the default (`auto`: the sm_90a CUDA kernel on sm_90)."""

import dataclasses
import math

import pytest
import torch

from helpers import (CUDA_DECODE_SMALL_CASES, EXTREME_SCALE_CASES, apply_extreme_scales, assert_close, golden_args,
                     paged_problem, pool_arrays)
from sglang_snapmla import numerics as nx
from sglang_snapmla import decode_plan, ops

pytestmark = pytest.mark.gpu

# The sm_90a decode computes the spec's numbers in other arithmetic: FP8 WGMMA accumulates QK with fewer mantissa
# bits than fp32 (LSE off by up to ~3e-3), so a P8 entry next to an e4m3 rounding boundary can round the other way,
# a 6-12 % change of that key's weight. Large problems average such flips out (rel-L2 <= 7.7e-3 over 100 seeds at
# 128 heads, so their tests keep 1e-2); on the small hard cases (few heads, few keys) a few flips are the whole
# output error: median 4-6e-3, p99 up to 1.6e-2, max 2.5e-2 over 100 seeds per case (2 heads, lengths
# [70, 1, 333, 129]; tools/kernel_dev/decode_seed_sweep.py, docs/BENCHMARKS.md). The bound is 1.6x that max;
# a wrong page, scale or split moves the output by O(1).
SMALL_CASE_REL_L2 = 4e-2


def _to(p, dev):
    return {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in p.items()}


def _quantized_problem(gen, seq_lens, heads, s_q):
    """A paged problem on the GPU (one all-zero content row per sequence), its SnapMLA cache, and the decode's
    arguments up to seq_lens: the quantized queries [B, s_q, heads, ...], the pool arrays, block table, lengths."""
    p = _to(paged_problem(gen, seq_lens, heads, s_q=s_q, zero_rows=1), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    B = len(seq_lens)
    q8, q_scale, q_rope = ops.quantize_q(p["q_nope"].to(torch.bfloat16).view(B * s_q, heads, -1),
                                         p["q_rope"].to(torch.bfloat16).view(B * s_q, heads, -1))
    return p, cache, (q8.view(B, s_q, heads, -1), q_scale.view(B, s_q, heads), q_rope.view(B, s_q, heads, -1),
                      *pool_arrays(cache), p["block_table"], p["seq_lens"])


@pytest.mark.parametrize("seq_lens,heads,s_q", [
    ([4300], 16, 4200),  # absorbed-MLA extend: 67200 query rows, more than a grid's y/z axis holds
    ([65536, 1, 4097, 30000], 16, 1),
    ([16384, 777], 128, 2),
    ([2000 + 13 * i for i in range(128)], 16, 1),
    ([1024 + 7 * i for i in range(64)], 64, 2),
    ([640], 128, 1),
])
@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_decode_real_sizes(gen, seq_lens, heads, s_q, impl):
    p = _to(paged_problem(gen, seq_lens, heads, s_q=s_q, zero_rows=3), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    out, lse = ops.quantize_and_decode(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16), *kv,
                                  p["block_table"], p["seq_lens"], p["softmax_scale"], impl=impl)
    q = nx.quantize_q(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16))
    ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    assert_close(out.float(), ref, rel_l2=1e-2, what=f"{impl} vs reference")
    # Hopper's FP8 MMA accumulates with reduced precision: LSE (~10) differs from the fp32 reference by ~5e-3
    assert (lse - ref_lse).abs().max() <= 1e-2
    gold, gold_lse = nx.mla_decode_golden(*golden_args(p))
    assert_close(out.float(), gold, rel_l2=5.5e-2, one_minus_cos=1.5e-3, what=f"{impl} vs golden")


# (heads, impl, q_in_decode): the last one the 64-row kernel quantizing Q itself
@pytest.mark.parametrize("heads,impl,q_in_decode", [(16, "triton", None), (16, "auto", None), (128, "triton", None),
                                                    (128, "auto", None), (128, "cuda", True)])
def test_decode_cuda_graph_replay_matches_eager(gen, heads, impl, q_in_decode):
    if impl == "cuda":
        from sglang_snapmla import cuda_ext

        if cuda_ext.unavailable_reason():
            pytest.skip(cuda_ext.unavailable_reason())
    p = _to(paged_problem(gen, [300, 4000, 64], heads, s_q=1), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    qn, qr = p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16)
    lens = p["seq_lens"].clone()
    eager, _ = ops.quantize_and_decode(qn, qr, *kv, p["block_table"], lens, p["softmax_scale"], impl=impl,
                                       q_in_decode=q_in_decode)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        graphed, _ = ops.quantize_and_decode(qn, qr, *kv, p["block_table"], lens, p["softmax_scale"], impl=impl,
                                             q_in_decode=q_in_decode)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(graphed, eager)
    lens[1] = 1000  # metadata changes between replays without re-capture
    g.replay()
    ref, _ = ops.quantize_and_decode(qn, qr, *kv, p["block_table"], lens, p["softmax_scale"], impl=impl,
                                     q_in_decode=q_in_decode)
    assert torch.equal(graphed, ref)


def test_append_and_fetch_beyond_2gb_offsets(gen):
    """Row offsets above 2^31 bytes (a 4.3M-token pool / batch) must not wrap (int32 overflow was a real bug)."""
    T = (1 << 31) // 576 + 4096  # bf16 input rows of 576 elements: the last rows sit past 2^31 elements*bytes
    latent = torch.randn(T, 576, device="cuda", dtype=torch.bfloat16)
    kv8, ks, kr = ops.pool_from_rows(latent[:, :512], latent[:, 512:])  # append_kv at slots 0..T-1
    tail = torch.arange(T - 3000, T, device="cuda")
    ref = nx.quantize_kv(latent[tail, :512], latent[tail, 512:])
    got = kv8[tail].view(torch.uint8)
    bad = (got != ref.content.view(torch.uint8)).any(1).nonzero().flatten()
    assert bad.numel() == 0, (f"{bad.numel()} rows differ, first at slot {int(tail[bad[0]])}; scale "
                              f"{ks[tail[bad[0]]].item()} vs {ref.scale[bad[0]].item()}; row bytes "
                              f"{got[bad[0], :8].tolist()} vs {ref.content[bad[0], :8].view(torch.uint8).tolist()}")
    assert torch.equal(ks[tail], ref.scale)
    c, r = ops.fetch_dequant(tail, kv8, ks, kr)
    ref_c, ref_r = nx.dequantize_kv(ref)
    assert torch.equal(c, ref_c) and torch.equal(r, ref_r)


@pytest.mark.parametrize("seq_lens,heads,s_q,outlier", [
    *CUDA_DECODE_SMALL_CASES,  # incl. the small hard cases tests/product/test_kernels.py runs on the Triton decode
    ([16384, 777], 128, 2, None),
    ([1024 + 7 * i for i in range(32)], 64, 1, None),
    ([2000 + 13 * i for i in range(48)], 32, 1, None),  # the narrow kernel over many pages and sequences
    ([5000, 64, 2, 4097], 16, 2, 1000.0),
])
def test_cuda_sm90_decode_matches_reference(gen, seq_lens, heads, s_q, outlier):
    """The sm_90a CUDA split kernel (SNAPMLA_DECODE_IMPL=cuda) against the spec, on the same inputs. LSE within
    Hopper's FP8 accumulation error (up to ~2.8e-3 measured; 1e-2 allowed); the output within SMALL_CASE_REL_L2."""
    from sglang_snapmla import cuda_ext

    if cuda_ext.unavailable_reason():
        pytest.skip(cuda_ext.unavailable_reason())
    p = _to(paged_problem(gen, seq_lens, heads, s_q=s_q, zero_rows=2, rope_outlier=outlier), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    q_nope, q_rope = p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16)
    out, lse = ops.quantize_and_decode(q_nope, q_rope, *kv, p["block_table"], p["seq_lens"], p["softmax_scale"],
                                  impl="cuda")
    q = nx.quantize_q(q_nope, q_rope)
    ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    assert_close(out.float(), ref, rel_l2=SMALL_CASE_REL_L2, what="cuda sm90 vs reference")
    assert (lse - ref_lse).abs().max() <= 1e-2
    tri, _ = ops.quantize_and_decode(q_nope, q_rope, *kv, p["block_table"], p["seq_lens"], p["softmax_scale"],
                                impl="triton")
    assert_close(out.float(), tri.float(), rel_l2=SMALL_CASE_REL_L2, what="cuda sm90 vs triton")


def _hard_query_rows(q_nope, q_rope, gen):
    """Q rows [T, H, ...] (bf16, in place) that reach every branch of the Q quantization: row scales from 1e-6 (under
    the 2^-20 scale floor) to 1e30, an all-zero row, signed zeros, subnormal bf16 values, and the spec's non-finite
    rows (a NaN in the content, an infinity in the RoPE, -inf in the content)."""
    T, H = q_nope.shape[:2]
    rows = torch.randperm(T * H, generator=gen)[:8].tolist()
    at = [(r // H, r % H) for r in rows]
    for (t, h), f in zip(at[:3], (1e-6, 1e30, 1e-30)):
        q_nope[t, h] *= f
        q_rope[t, h] *= f
    q_nope[at[3]] = 0
    q_rope[at[3]] = 0
    q_nope[at[4]][::7] = -0.0
    q_nope[at[4]][1::7] = torch.tensor(2.0 ** -130, dtype=torch.bfloat16)  # a subnormal
    q_nope[at[5]][3] = float("nan")
    q_rope[at[6]][60] = float("inf")
    q_nope[at[7]][500] = float("-inf")


# (seq_lens, heads, s_q): several splits and one (a batch of 200 sequences of 2 tiles), a last tile only partly
# inside R (48 heads x 2 tokens = 96 rows), 3 tokens of 16 heads (48 rows: tiles across tokens)
Q_IN_DECODE_CASES = [([640] * 4, 128, 1), ([16384, 777], 128, 2), ([1024 + 7 * i for i in range(200)], 128, 1),
                     ([300, 64, 4097], 48, 2), ([1000, 70], 16, 3), ([2000 + 13 * i for i in range(40)], 64, 1)]


@pytest.mark.parametrize("seq_lens,heads,s_q", Q_IN_DECODE_CASES)
@pytest.mark.parametrize("layout", ["contiguous", "head_major"])
def test_q_in_decode_gives_the_bits_of_the_q_quant_kernel(gen, monkeypatch, seq_lens, heads, s_q, layout):
    """The 64-row kernel quantizing Q itself (`DecodePlan.q_in_decode`) computes the Q-quant kernel's bytes (the
    spec's, tests/product/test_kernels.py) and then the same decode: out and LSE equal bit for bit to the Q-quant
    kernel followed by the decode, on hard rows (`_hard_query_rows`: non-finite rows give NaN outputs in both), with
    q_nope contiguous or head-major as SGLang's absorbed BMM writes it ([H, T, 512] transposed) and q_rope a slice of
    wider rows."""
    from sglang_snapmla import cuda_ext

    if cuda_ext.unavailable_reason():
        pytest.skip(cuda_ext.unavailable_reason())
    p = _to(paged_problem(gen, seq_lens, heads, s_q=s_q, zero_rows=2), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    B, T = len(seq_lens), len(seq_lens) * s_q
    qn = p["q_nope"].to(torch.bfloat16).view(T, heads, 512)
    qr = p["q_rope"].to(torch.bfloat16).view(T, heads, 64)
    _hard_query_rows(qn, qr, gen)
    if layout == "head_major":
        qn = qn.transpose(0, 1).contiguous().transpose(0, 1)
    wide = torch.zeros(T, heads, 576, dtype=torch.bfloat16, device="cuda")
    wide[..., 512:] = qr
    qr = wide[..., 512:]
    table, lens = p["block_table"], p["seq_lens"]
    fused = decode_plan.plan_decode(B, s_q, heads, table.shape[1], qn.device, "cuda", q_in_decode=True)
    assert fused.q_in_decode
    ops.check_decode_step(table, lens, fused, kv[0].shape[0])
    quantize_q = ops.quantize_q
    monkeypatch.setattr(ops, "quantize_q", lambda *a: pytest.fail("the Q-quant kernel ran for a q_in_decode plan"))
    out, lse = ops.quantize_and_decode_planned(qn, qr, *kv, table, lens, p["softmax_scale"], fused)
    monkeypatch.setattr(ops, "quantize_q", quantize_q)
    ref, ref_lse = ops.quantize_and_decode_planned(qn, qr, *kv, table, lens, p["softmax_scale"],
                                                   dataclasses.replace(fused, q_in_decode=False))
    torch.cuda.synchronize()
    differ = (out.view(torch.int16) != ref.view(torch.int16)).any(-1)
    assert not differ.any(), f"{int(differ.sum())} of {differ.numel()} rows differ, first {differ.nonzero()[0]}"
    assert torch.equal(lse.view(torch.int32), ref_lse.view(torch.int32))
    assert out.isnan().any() and not out.isnan().all()  # the non-finite rows reached the output, the others did not


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_pdl_chain_matches_serial_launches(gen, impl, monkeypatch):
    """Q-quant -> decode -> combine with programmatic dependent launch (decode_plan.pdl_enabled) give the same bits as
    plainly serialized launches, in a CUDA graph of back-to-back layers where kernels before each layer's Q-quant
    rewrite its queries, the pool's scales, the block table and the lengths: a dependent kernel reading any of them
    before it may (the queries before griddepcontrol.wait; the CUDA decode reads the metadata and its first pages
    before the wait, `follows_q_quant`) would see the previous layer's values."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    lens = [[640, 64, 3000], [600, 1, 2999], [64, 700, 128]]
    p = _to(paged_problem(gen, lens[0], 128, s_q=1), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    pages = cache.content.shape[0] // nx.PAGE_SIZE
    # two copies of the pool; odd layers read the second one (block table + pages)
    kv8 = torch.cat([cache.content.view(torch.uint8)] * 2).view(cache.content.dtype)
    scale0 = torch.cat([cache.scale, cache.scale * 2]).contiguous()
    rope = torch.cat([cache.rope, cache.rope]).contiguous()
    bts = [p["block_table"], p["block_table"] + pages]
    lens = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in lens]
    qn, qr = p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16)
    layers = 8

    def run_layers(pdl: str):
        monkeypatch.setenv("SNAPMLA_PDL", pdl)
        assert decode_plan.pdl_enabled(qn.device) == (pdl == "1")
        q_layer, scale, bt, seq_lens = torch.empty_like(qn), torch.empty_like(scale0), torch.empty_like(bts[0]), \
            torch.empty_like(lens[0])
        outs = []
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g):
            for layer in range(layers):
                # the producers of this layer's queries, pool and metadata
                torch.mul(qn, 1.0 + 0.25 * layer, out=q_layer)
                torch.mul(scale0, 1.0 + 0.125 * layer, out=scale)
                bt.copy_(bts[layer % 2])
                seq_lens.copy_(lens[layer % 3])
                outs.append(ops.quantize_and_decode(q_layer, qr, kv8, scale, rope, bt, seq_lens, p["softmax_scale"],
                                               impl=impl)[0])
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        torch.cuda.synchronize()
        return torch.stack(outs)

    serial, chained = run_layers("0"), run_layers("1")
    for layer in range(1, layers):  # consecutive layers differ, so a stale read would show
        assert not torch.equal(serial[layer - 1], serial[layer])
    assert torch.equal(chained, serial)


def test_cuda_decode_with_more_splits_than_a_short_sequence_needs(gen):
    """Serving sets the split count for the longest sequence a CUDA graph can hold, so short sequences run with many
    splits that hold no page (LSE -inf, skipped by the combine). Same results as the reference, whatever the count."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    p = _to(paged_problem(gen, [640, 64, 1, 3000], 128, s_q=1, zero_rows=1), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    q = nx.quantize_q(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16))
    ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    for splits in (1, 7, 64):
        out, lse = ops.quantize_and_decode(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16), *kv,
                                      p["block_table"], p["seq_lens"], p["softmax_scale"], num_splits=splits)
        assert_close(out.float(), ref, rel_l2=1e-2, what=f"{splits} splits vs reference")
        assert (lse - ref_lse).abs().max() <= 1e-2


@pytest.mark.parametrize("case", EXTREME_SCALE_CASES)
@pytest.mark.parametrize("splits", [1, 3])
def test_cuda_decode_extreme_scales_match_reference(gen, case, splits):
    """The CUDA decode's softmax works in the log domain of P' = P sigma_k with a per-page reference kept within 2^64
    of the row's running max (docs/KERNEL.md). Two cases that exercise it, against the spec:
    dominant_first_page -- page 0's keys are aligned with head 0's query (logits ~+170 over the rest, far past the
    2^64 clamp: every later page of that row is clamped); token_scales_over_six_decades -- each key's content
    is scaled by 10^U(-3, 3), so sigma_k (and log2 sigma_k inside the exponent) spreads over ~2^20 within a page,
    with the query's content scaled down by 1e3 to keep the logits O(1) (logits of ~1e3 would make the output
    hinge on Hopper's FP8 accumulation error, which this test is not about)."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    p = paged_problem(gen, [700, 1500, 64], 128, s_q=1, zero_rows=1)
    apply_extreme_scales(p, case, gen)
    p = _to(p, "cuda")
    cache = nx.quantize_kv(p["c_kv"].to(torch.bfloat16), p["k_rope"].to(torch.bfloat16))
    kv = pool_arrays(cache)
    q_nope, q_rope = p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16)
    q = nx.quantize_q(q_nope, q_rope)
    ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    out, lse = ops.quantize_and_decode(q_nope, q_rope, *kv, p["block_table"], p["seq_lens"], p["softmax_scale"],
                                  num_splits=splits, impl="cuda")
    assert_close(out.float(), ref, rel_l2=1e-2, what=f"{case}, {splits} splits vs reference")
    assert ((lse - ref_lse).abs() <= 1e-2 * ref_lse.abs().clamp_min(1)).all()


@pytest.mark.parametrize("heads,s_q,splits", [(128, 1, 1), (128, 1, 3), (16, 2, 1), (16, 1, 5)])
def test_cuda_decode_many_uneven_sequences_match_each_alone(gen, heads, s_q, splits):
    """More (tile, sequence, split) CTAs than SMs, uneven lengths (with splits, some without pages): the batch must
    match the reference, and each sequence decoded alone must give the same bits (no state leaks between CTAs or
    work items; a persistent grid would run several per CTA)."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    lens = torch.randint(s_q, 400, (300,), generator=gen).tolist()  # a sequence holds its s_q query tokens
    lens[:4] = [s_q, 64, 65, 129]
    p = _to(paged_problem(gen, lens, heads, s_q=s_q, zero_rows=1), "cuda")
    cache = nx.quantize_kv(p["c_kv"], p["k_rope"])
    kv = pool_arrays(cache)
    q = nx.quantize_q(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16))
    ref, ref_lse = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    out, lse = ops.quantize_and_decode(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16), *kv,
                                  p["block_table"], p["seq_lens"], p["softmax_scale"], num_splits=splits,
                                  impl="cuda")
    assert_close(out.float(), ref, rel_l2=1e-2, what=f"{splits} splits vs reference")
    assert (lse - ref_lse).abs().max() <= 1e-2
    # each sequence alone (one CTA per item) gives the same bits: items do not leak state into each other
    for b in (0, 3, 150, 299):
        one, one_lse = ops.quantize_and_decode(p["q_nope"][b:b + 1].to(torch.bfloat16),
                                          p["q_rope"][b:b + 1].to(torch.bfloat16), *kv, p["block_table"][b:b + 1],
                                          p["seq_lens"][b:b + 1], p["softmax_scale"], num_splits=splits,
                                          impl="cuda")
        assert torch.equal(one, out[b:b + 1]) and torch.equal(one_lse, lse[b:b + 1])


@pytest.mark.parametrize("seq_lens,heads,s_q,splits", [([640], 128, 1, 10), ([130, 3, 4097], 16, 2, 5),
                                                       ([1, 64, 100, 4097], 128, 1, 3), ([130, 3, 4097], 64, 1, 5),
                                                       ([130, 4, 2000], 16, 3, 4)])
def test_cuda_decode_partials_in_padded_slots(gen, seq_lens, heads, s_q, splits):
    """The sm_90a decode writes split s of a row into slot s of o_part [B, R, slots, 512] / lse_part [B, R, slots]
    (slots >= splits, decode_plan.partial_slots): through the combine, bit for bit the unpadded partials' result,
    whatever the slots past the splits hold (NaN here; the kernel must neither write nor count them), and the spec's
    output. 48 query rows (16 heads at s_q 3) leave a 64-row tile's last 16 rows past R, which the kernel must not
    write: they would land in the next sequence's rows."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    p, cache, args = _quantized_problem(gen, seq_lens, heads, s_q)
    B, R = len(seq_lens), s_q * heads
    none = torch.empty(0, device="cuda")
    results = []
    for slots in (splits, splits + 6, 16):
        o_part = torch.full((B, R, slots, nx.KV_LORA_RANK), float("nan"), device="cuda")
        lse_part = torch.full((B, R, slots), float("nan"), device="cuda")
        ops.launch_cuda_decode(*args, o_part, lse_part, none.bfloat16(), none, p["softmax_scale"], splits)
        assert lse_part[:, :, splits:].isnan().all()
        out = torch.empty(B, s_q, heads, nx.KV_LORA_RANK, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, heads, s_q, device="cuda")
        ops.combine(o_part, lse_part, out, lse, heads, s_q, splits=splits)
        results.append((out, lse))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    assert not results[0][0].isnan().any()
    q = nx.quantize_q(p["q_nope"].to(torch.bfloat16), p["q_rope"].to(torch.bfloat16))
    ref, _ = nx.snapmla_decode_reference(q, cache, p["block_table"], p["seq_lens"], p["softmax_scale"])
    assert_close(results[0][0].float(), ref, rel_l2=SMALL_CASE_REL_L2, what="padded-slot partials vs reference")


@pytest.mark.parametrize("seq_lens,heads,s_q", [([1, 64, 100, 4097], 128, 1), ([130, 3, 65], 16, 3),
                                                ([200, 37, 640], 64, 2)])
def test_cuda_decode_final_outputs_equal_partials_through_the_combine(gen, seq_lens, heads, s_q):
    """With one split the sm_90a decode writes the bf16 output and the natural-log LSE itself (no partials, no
    combine). Bit for bit what the combine makes of the same kernel's single partial, which this test launches too."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    p, cache, args = _quantized_problem(gen, seq_lens, heads, s_q)
    args = (*args, p["softmax_scale"])
    B, R = len(seq_lens), s_q * heads
    out, lse = ops.decode_quantized(*args, num_splits=1, impl="cuda")

    o_part = torch.empty(B, R, 1, nx.KV_LORA_RANK, dtype=torch.float32, device="cuda")
    lse_part = torch.empty(B, R, 1, dtype=torch.float32, device="cuda")
    none = torch.empty(0, device="cuda")
    ops.launch_cuda_decode(*args[:8], o_part, lse_part, none.bfloat16(), none, p["softmax_scale"], 1)
    ref_out, ref_lse = torch.empty_like(out), torch.empty_like(lse)
    ops.combine(o_part, lse_part, ref_out, ref_lse, heads, s_q)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    with pytest.raises(RuntimeError, match="only with num_splits == 1"):
        ops.launch_cuda_decode(*args[:8], o_part, lse_part, out, lse, 1.0, 2)


def test_cuda_decode_refuses_a_block_table_bound_past_the_tables_storage(gen):
    """The sm_90a decode reads block-table entries up to `bt_entries` (the table's storage from its first element,
    `ops.block_table_entries`), whatever the view's width. A bound past the storage would let it read beyond the
    allocation: the module that serves (prebuilt library or built extension) refuses it before the launch, and
    takes the bound that ends exactly at the storage, here for a view that starts one row into its table."""
    if decode_plan.decode_impl("auto") != "cuda":
        pytest.skip("the sm_90a CUDA decode is not available on this GPU")
    from sglang_snapmla import cuda_ext

    p, _, args = _quantized_problem(gen, [100, 3], 16, 1)
    q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, table, lens = args
    wide = torch.cat([torch.zeros_like(table[:1]), table]).contiguous()
    view = wide[1:]  # the same entries, one row into the storage
    out = torch.empty(2, 1, 16, nx.KV_LORA_RANK, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 16, 1, device="cuda")
    none = torch.empty(0, device="cuda")

    def launch(bt_entries):
        cuda_ext.load().decode_split(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, view, lens, none, none, out,
                                     lse, 16, 16, 1, p["softmax_scale"] * math.log2(math.e), 1, bt_entries, 0)

    entries = ops.block_table_entries(view)
    assert entries == view.numel()
    with pytest.raises(RuntimeError, match="exceeds the block table's storage"):
        launch(entries + 1)
    with pytest.raises(RuntimeError, match="exceeds the block table's storage"):
        launch(-1)
    launch(entries)
    ref, _ = ops.decode_quantized(*args, p["softmax_scale"], num_splits=1, impl="cuda")
    assert torch.equal(out, ref)


def test_the_prebuilt_library_passes_its_start_up_check_here(tmp_path):
    """The library a wheel ships (the checkout's, else one built here with nvcc), loaded with ctypes, passes the check
    a server runs before it serves with it (`prebuilt.self_check`: one split and three against the spec, the
    partials 16 slots apart as a server pads them)."""
    from sglang_snapmla import prebuilt

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the prebuilt library is built for sm_90a")
    library = prebuilt.LIBRARY if prebuilt.LIBRARY.exists() else prebuilt.build(tmp_path / prebuilt.LIBRARY.name)
    assert prebuilt.self_check(prebuilt.PrebuiltDecode(library)) is None
