"""Triton split-KV SnapMLA decode over a paged FP8 latent cache, and the combine of the splits.

Program (b, split, row-tile): rows are the flattened (query token, head) pairs of sequence b (BLOCK_M of them);
the split owns a contiguous range of 64-token pages, visited in strictly increasing order. Per page:
  scores = (q8 . k8^T  [fp8 x fp8 dot]  +  q_rope' . k_rope'^T  [bf16 dot]) * sigma_q * sigma_k * scale*log2(e)
  online softmax in base 2; P' = P * sigma_k; sigma_P = max(rowmax(P')/448, tiny); p8 = fp8(P'/sigma_P)
  acc = acc * alpha + (p8 . k8 [fp8 x fp8 dot]) * sigma_P
The split writes acc / l and its base-2 LSE; the combine kernel merges splits with their LSEs. With one split
(FINAL) the kernel writes the final bf16 output and natural-log LSE itself, exactly what the combine would make of
its single partial, and no combine runs.
No host synchronisation: page counts and split ranges are computed from device tensors inside the kernel.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

LATENT = tl.constexpr(512)
ROPE = tl.constexpr(64)
PAGE = tl.constexpr(64)
CHUNK = tl.constexpr(128)  # LATENT = 4 * CHUNK


@triton.jit
def decode_split_kernel(
    q8_ptr, q_scale_ptr, q_rope_ptr,  # [B, R, 512] fp8, [B, R] fp32, [B, R, 64] bf16 with R = s_q * H (contiguous)
    kv_content_ptr, kv_scale_ptr, kv_rope_ptr,  # [N, 512] fp8, [N] fp32, [N, 64] bf16
    block_table_ptr, seq_lens_ptr,  # [B, max_pages] int32, [B] int32
    o_part_ptr, lse_part_ptr,  # [B, R, PART_SLOTS, 512] fp32, [B, R, PART_SLOTS] fp32 (base-2 LSE); split s in slot s
    out_ptr, lse_ptr,  # FINAL only: [B, R, 512] bf16, [B, H, s_q] fp32 (natural log), the combine's outputs
    stride_bt, R, H, S_Q,
    qk_scale_log2,  # softmax_scale * log2(e)
    NUM_SPLITS,  # runtime, not constexpr: one compiled kernel serves every batch size (CUDA-graph capture)
    PART_SLOTS,  # partial slots per row, >= NUM_SPLITS (sglang_snapmla.decode_plan.partial_slots)
    BLOCK_M: tl.constexpr,
    FP8_MAX: tl.constexpr, P_SCALE_FLOOR: tl.constexpr,
    FINAL: tl.constexpr = False,  # NUM_SPLITS == 1: write out / lse instead of the partials
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    dr = tl.arange(0, ROPE)
    keys = tl.arange(0, PAGE)

    seq_len = tl.load(seq_lens_ptr + b)
    n_pages = tl.cdiv(seq_len, PAGE)
    per_split = tl.cdiv(n_pages, NUM_SPLITS)
    first = split * per_split
    last = tl.minimum(first + per_split, n_pages)
    # query token of each row sees keys [0, seq_len - S_Q + token]
    last_key = seq_len - S_Q + rows // H

    q_row = (b * R + rows).to(tl.int64)
    # The 512-wide latent is handled as four 128-wide chunks held in separate tensors: each MMA operand tile is
    # then 8 KB instead of 32 KB, which keeps the kernel out of register spills at every tile height.
    dq = tl.arange(0, CHUNK)
    q_base = q8_ptr + q_row[:, None] * LATENT + dq[None, :]
    q0 = tl.load(q_base + 0 * CHUNK, mask=row_ok[:, None], other=0.0)
    q1 = tl.load(q_base + 1 * CHUNK, mask=row_ok[:, None], other=0.0)
    q2 = tl.load(q_base + 2 * CHUNK, mask=row_ok[:, None], other=0.0)
    q3 = tl.load(q_base + 3 * CHUNK, mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_rope_ptr + q_row[:, None] * ROPE + dr[None, :], mask=row_ok[:, None], other=0.0)
    q_scale = tl.load(q_scale_ptr + q_row, mask=row_ok, other=0.0) * qk_scale_log2

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
    acc1 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
    acc2 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
    acc3 = tl.zeros([BLOCK_M, CHUNK], tl.float32)

    for page_idx in range(first, last):
        page = tl.load(block_table_ptr + b * stride_bt + page_idx).to(tl.int64)
        slots = page * PAGE + keys
        # K^T chunks [128, 64] (K-major, as the FP8 MMA wants B) for QK, V chunks [64, 128] for PV: two reads of
        # the same page, the second from L1/L2; each load feeds exactly one dot.
        # Slots at or past seq_len may hold anything (a reused page's stale bytes, NaN included). What QK makes of
        # them is replaced by -inf below; the scale and V, which meet P by multiplication, are not read there.
        key_pos = page_idx * PAGE + keys
        written = key_pos < seq_len
        kt_base = kv_content_ptr + slots[None, :] * LATENT + dq[:, None]
        k_rope_t = tl.load(kv_rope_ptr + slots[None, :] * ROPE + dr[:, None])
        k_scale = tl.load(kv_scale_ptr + slots, mask=written, other=0.0)

        s = tl.dot(q_rope, k_rope_t)
        s = tl.dot(q0, tl.load(kt_base + 0 * CHUNK), s)
        s = tl.dot(q1, tl.load(kt_base + 1 * CHUNK), s)
        s = tl.dot(q2, tl.load(kt_base + 2 * CHUNK), s)
        s = tl.dot(q3, tl.load(kt_base + 3 * CHUNK), s)
        s = s * q_scale[:, None] * k_scale[None, :]
        visible = key_pos[None, :] <= last_key[:, None]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked rows keep p = 0, alpha = 0
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)

        # fuse V's per-token scale into P; an invisible key weighs exactly 0 whatever its scale holds (NaN x 0)
        p_v = tl.where(visible, p * k_scale[None, :], 0.0)
        p_scale = tl.maximum(tl.max(p_v, axis=1) / FP8_MAX, P_SCALE_FLOOR)
        p8 = (p_v / p_scale[:, None]).to(tl.float8e4nv)
        v_base = kv_content_ptr + slots[:, None] * LATENT + dq[None, :]
        v_ok, a, ps = written[:, None], alpha[:, None], p_scale[:, None]
        acc0 = acc0 * a + tl.dot(p8, tl.load(v_base + 0 * CHUNK, mask=v_ok, other=0.0)) * ps
        acc1 = acc1 * a + tl.dot(p8, tl.load(v_base + 1 * CHUNK, mask=v_ok, other=0.0)) * ps
        acc2 = acc2 * a + tl.dot(p8, tl.load(v_base + 2 * CHUNK, mask=v_ok, other=0.0)) * ps
        acc3 = acc3 * a + tl.dot(p8, tl.load(v_base + 3 * CHUNK, mask=v_ok, other=0.0)) * ps
        m = m_new

    # rows without a visible key (l = 0): out 0, LSE -inf; a NaN l (a non-finite key or query the row sees) stays NaN
    has = l != 0.0
    inv_l = 1.0 / tl.where(has, l, 1.0)
    lse2 = tl.where(has, m + tl.log2(tl.where(has, l, 1.0)), float("-inf"))
    if FINAL:
        out_base = out_ptr + (b * R + rows).to(tl.int64)[:, None] * LATENT + dq[None, :]
        ok = row_ok[:, None]
        tl.store(out_base + 0 * CHUNK, (acc0 * inv_l[:, None]).to(tl.bfloat16), mask=ok)
        tl.store(out_base + 1 * CHUNK, (acc1 * inv_l[:, None]).to(tl.bfloat16), mask=ok)
        tl.store(out_base + 2 * CHUNK, (acc2 * inv_l[:, None]).to(tl.bfloat16), mask=ok)
        tl.store(out_base + 3 * CHUNK, (acc3 * inv_l[:, None]).to(tl.bfloat16), mask=ok)
        tl.store(lse_ptr + (b * H + rows % H) * S_Q + rows // H, lse2 * 0.6931471805599453, mask=row_ok)
        return
    part = (b * R + rows).to(tl.int64) * PART_SLOTS + split
    o_base = o_part_ptr + part[:, None] * LATENT + dq[None, :]
    # rows without a key in this split (all of them past a short sequence's end) leave their partial row unwritten:
    # their LSE is -inf, so the combine does not read it
    o_ok = (row_ok & has)[:, None]
    tl.store(o_base + 0 * CHUNK, acc0 * inv_l[:, None], mask=o_ok)
    tl.store(o_base + 1 * CHUNK, acc1 * inv_l[:, None], mask=o_ok)
    tl.store(o_base + 2 * CHUNK, acc2 * inv_l[:, None], mask=o_ok)
    tl.store(o_base + 3 * CHUNK, acc3 * inv_l[:, None], mask=o_ok)
    tl.store(lse_part_ptr + part, lse2, mask=row_ok)


@triton.jit
def combine_kernel(
    o_part_ptr, lse_part_ptr,  # [B, R, PART_SLOTS, 512] fp32, [B, R, PART_SLOTS] fp32 (base 2); split s in slot s
    out_ptr, lse_ptr,  # [B, R, 512] bf16 (== [B, s_q, H, 512]), [B, H, s_q] fp32 (natural log)
    R, H, S_Q,
    NUM_SPLITS,  # runtime: the loop below keeps one chunk of rows in registers whatever the split count
    PART_SLOTS,  # partial slots per row, >= NUM_SPLITS; slots from NUM_SPLITS on are never read
    SPLITS_P2: tl.constexpr,  # next power of two >= NUM_SPLITS: all LSEs of a row are read as one vector
    SPLIT_CHUNK: tl.constexpr,  # partial rows read by one load (a power of two <= SPLITS_P2)
    PDL: tl.constexpr,  # launched as a programmatic dependent of the split kernel: wait for its partials
):
    if PDL:
        gdc_wait()  # before any global access (the partials, and outputs the previous kernel may still read)
    r = tl.program_id(0)  # rows on the x axis: R = s_q * H exceeds the 65535 limit of y/z for long extends
    b = tl.program_id(1)
    dc = tl.arange(0, LATENT)
    base = (b * R + r).to(tl.int64) * PART_SLOTS
    # The first SPLIT_CHUNK partial rows are loaded in the same round trip as the LSEs, not behind them: at batch 1
    # the combine is two dependent round trips long, and this removes one (H100, the combine alone at 10 splits:
    # 2.4 us, against 3.2 with every row read behind the LSEs; docs/KERNEL.md). Rows of splits without a key (past a
    # short sequence's end, possibly never written) are discarded by a select on their LSE, so whatever bytes they
    # hold never reach the output.
    sc = tl.arange(0, SPLIT_CHUNK)
    o_first = tl.load(o_part_ptr + (base + sc)[:, None] * LATENT + dc[None, :], mask=(sc < NUM_SPLITS)[:, None],
                      other=0.0)
    # one vector load of the row's LSEs, not a loop of dependent scalar loads (serving sizes the split count for the
    # longest sequence a CUDA graph holds: 57 splits for a 640-token sequence at a 32k context). Splits without a
    # key for this row carry -inf (weight 0).
    sp = tl.arange(0, SPLITS_P2)
    lse_all = tl.load(lse_part_ptr + base + sp, mask=sp < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse_all, axis=0)  # (a max may skip NaN operands: a NaN split is detected on its own below)
    # a split's NaN LSE: the row sees a non-finite key or has a non-finite query; the row's result is NaN
    nan_row = tl.max((lse_all != lse_all).to(tl.int32), axis=0) > 0
    # m = -inf otherwise: the row sees no key in any split (a padding row, or seq_len 0): out 0, LSE -inf at every
    # split count
    empty = (m == float("-inf")) & (not nan_row)
    m = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.exp2(lse_all - m), axis=0)  # 0 for an empty row
    lse_first = tl.load(lse_part_ptr + base + sc, mask=sc < NUM_SPLITS, other=float("-inf"))
    keyed = lse_first > float("-inf")
    out = tl.sum(tl.exp2(lse_first - m)[:, None] * tl.where(keyed[:, None], o_first, 0.0), axis=0)
    # Beyond the first chunk, only splits up to the last one with a key are visited, SPLIT_CHUNK rows per load, and
    # a keyless split's row is not read at all (masked: 4 bytes instead of 2 KB)
    n_visit = tl.max(tl.where(lse_all > float("-inf"), sp + 1, 0), axis=0)
    for first in range(SPLIT_CHUNK, n_visit, SPLIT_CHUNK):
        lse_c = tl.load(lse_part_ptr + base + first + sc, mask=first + sc < n_visit, other=float("-inf"))
        o_c = tl.load(o_part_ptr + (base + first + sc)[:, None] * LATENT + dc[None, :],
                      mask=(lse_c > float("-inf"))[:, None], other=0.0)
        out += tl.sum(tl.exp2(lse_c - m)[:, None] * o_c, axis=0)
    out = tl.where(nan_row, float("nan"), out / tl.where(empty, 1.0, denom))
    tl.store(out_ptr + (b * R + r).to(tl.int64) * LATENT + dc, out.to(tl.bfloat16))
    token = r // H
    head = r % H
    lse = tl.where(empty, float("-inf"), (m + tl.log2(denom)) * 0.6931471805599453)
    lse = tl.where(nan_row, float("nan"), lse)
    tl.store(lse_ptr + (b * H + head) * S_Q + token, lse)
