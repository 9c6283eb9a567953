"""Emulates the sm_90a decode's V transpose (`transpose_half` in snapmla_decode_sm90.cu) on byte coordinates.

The ldmatrix.x4.trans reads from the 128 B-swizzled staged page, the byte permutes and the stmatrix.x4 writes into
V^T are replayed with the kernel's address formulas (keep them in sync); then V^T is read the way the PV WGMMA's
descriptor reads it, and every (channel, slot) must hold that channel of the token which the P8 store order puts in
the slot. Each 8-row ldmatrix / stmatrix phase must touch 8 distinct 16 B bank groups (no bank conflicts). The narrow
kernel's P8 word stores are replayed the same way: every (query row, token) where the PV WGMMA reads that token's V^T
column. Its V^T fragments (`transpose_half_fragments`) too: every byte of every register where an m64nNk32 A fragment
expects (channel `narrow_pv_channel`, the token of its K slot), each channel of a half in one M row.
    usage: python -m tools.kernel_dev.emulate_transpose
"""

TILE = 8192  # one swizzled [64 tokens x 128 B] staged tile
VT_STRIDE = 528  # kVTStride: bytes between 8-channel rows of V^T


def staged_offset(token: int, channel: int) -> int:
    """Byte offset of (token, channel) in a staged page: four 128 B-swizzled tiles of 128 channels."""
    b = channel % 128
    return channel // 128 * TILE + token * 128 + ((((b >> 4) & 7) ^ (token & 7)) << 4) + (b & 15)


def slot_token(slot: int) -> int:
    """Token held by `slot` (0..63) of V^T and P8: slots 4q..4q+3 of a 16-token group hold 2q, 2q+1, 8+2q, 9+2q."""
    s = slot % 16
    return slot - s + 2 * (s // 4) + s % 2 + 8 * ((s // 2) % 2)


def byte_perm(x, y, selector):
    src = x + y
    return [src[(selector >> (4 * i)) & 15] for i in range(4)]


def distinct_bank_groups(addresses) -> bool:
    return len({a % 128 // 16 for a in addresses}) == len(addresses)


def staged_page() -> dict:
    """{byte offset in a staged page: (token, channel)}."""
    return {staged_offset(t, c): (t, c) for t in range(64) for c in range(512)}


def unit_read_addresses(warp: int, tile: int, g: int) -> dict:
    """ldmatrix.x4.trans of unit (warp, g) in staged tile `tile`: lane L gives the address of row L % 8 of matrix
    L // 8 (tokens 16 g + 8 (m & 1) + r, 16 B chunk 2 warp + (m >> 1), swizzled)."""
    return {(L // 8, L % 8): (8 * (L // 8 & 1) + L % 8) * 128 + (((2 * warp + (L // 8 >> 1)) ^ (L % 8)) << 4)
            + tile * TILE + g * 16 * 128 for L in range(32)}


def unit_registers(page: dict, rd: dict, lane: int) -> list:
    """The thread's four registers after the .trans read (b16 elements [2q][j] and [2q+1][j] of each 8 x 8 matrix)
    and the two byte permutes per register pair: x0, y0, x1, y1, each [(token, channel)] x 4."""
    q, j = lane % 4, lane // 4
    regs = [[page[rd[m, 2 * q] + 2 * j], page[rd[m, 2 * q] + 2 * j + 1],
             page[rd[m, 2 * q + 1] + 2 * j], page[rd[m, 2 * q + 1] + 2 * j + 1]] for m in range(4)]
    return [byte_perm(regs[0], regs[1], 0x6420), byte_perm(regs[0], regs[1], 0x7531),
            byte_perm(regs[2], regs[3], 0x6420), byte_perm(regs[2], regs[3], 0x7531)]


def transpose():
    """V^T as {byte offset: (token, channel)} after the 4 warps' 16 units each."""
    page = staged_page()
    vt = {}
    for warp in range(4):
        for ci in range(4):
            for g in range(4):
                rd = unit_read_addresses(warp, ci, g)
                assert all(distinct_bank_groups([rd[m, r] for r in range(8)]) for m in range(4))
                # stmatrix: lane L gives the address of row L % 8 of matrix L // 8
                wr = {(L // 8, L % 8): (4 * warp + 2 * (L // 8 >> 1) + L % 8 // 4) * VT_STRIDE
                      + (2 * (L % 8 % 4) + (L // 8 & 1)) * 16 + ci * 16 * VT_STRIDE + g * 128 for L in range(32)}
                assert all(distinct_bank_groups([wr[m, r] for r in range(8)]) for m in range(4))
                for lane in range(32):
                    q, j = lane % 4, lane // 4
                    out = unit_registers(page, rd, lane)
                    for m in range(4):  # the masked variant's token pattern for this thread's bytes
                        assert [t for t, _ in out[m]] == [16 * g + 2 * q + d for d in (0, 1, 8, 9)]
                        for k in range(4):  # row j of matrix m, bytes 4q..4q+3
                            offset = wr[m, j] + 4 * q + k
                            assert offset not in vt
                            vt[offset] = out[m][k]
    return vt


def narrow_pv_channel(half: int, mt: int, warp: int, lane: int, h: int) -> int:
    """The kernel's `narrow_pv_channel`: latent channel of accumulator row 16 warp + lane // 4 + 8 h of M tile mt."""
    return half * 256 + (mt >> 1) * 128 + 32 * warp + 16 * (mt & 1) + 2 * (lane // 4) + h


def narrow_fragments():
    """The narrow kernel's `transpose_half_fragments`: {(half, warp, lane, mt, ks, reg): [(token, channel)] x 4}."""
    page = staged_page()
    frags = {}
    for half in range(2):
        for warp in range(4):
            for ci in range(2):
                for g in range(4):
                    rd = unit_read_addresses(warp, 2 * half + ci, g)
                    for lane in range(32):
                        x0, y0, x1, y1 = unit_registers(page, rd, lane)
                        ks, lo = g // 2, 2 * (g % 2)
                        for mt, reg, val in ((2 * ci, lo, x0), (2 * ci, lo + 1, y0), (2 * ci + 1, lo, x1),
                                             (2 * ci + 1, lo + 1, y1)):
                            key = (half, warp, lane, mt, ks, reg)
                            assert key not in frags
                            frags[key] = val
    return frags


def narrow_p8_stores(n_rows: int) -> dict:
    """The narrow kernel's P8 word stores (P8 [n_rows x 64 tokens], K-major core matrices: row n at n // 8 x 512 +
    n % 8 x 16, 16-token group g at g x 128). Thread (warp, lane) holds accumulator rows = tokens 16 warp + lane // 4
    (+ 8) of the query rows 8 (i // 2) + 2 (lane % 4) + i % 2, converted to one fp8 pair per row (tok0 low, tok0 + 8
    high). For each two rows 2j, 2j + 1 the lanes 4 apart (tokens 2m and 2m + 1, m = lane // 8) trade one pair by
    shfl.bfly 4 (the even lane sends row 2j + 1's, the odd one row 2j's), and each lane stores row 2j + odd as one
    word: __byte_perm(own pair, partner's pair, 0x5140 even / 0x1504 odd) at slot 4m. Each word store's 32 lanes must
    hit 32 distinct banks. Returns {byte offset: (query row, token)}."""
    p8 = {}
    for warp in range(4):
        # lane -> [(row, token) of the low byte, of the high byte] for each of its rows
        pairs = {lane: [[(8 * (i // 2) + 2 * (lane % 4) + i % 2, 16 * warp + lane // 4 + 8 * h) for h in range(2)]
                        for i in range(n_rows // 4)] for lane in range(32)}
        for j in range(n_rows // 8):
            words = []
            for lane in range(32):
                odd = (lane >> 2) & 1
                sent = pairs[lane ^ 4][2 * j] if (lane ^ 4) >> 2 & 1 else pairs[lane ^ 4][2 * j + 1]
                own = pairs[lane][2 * j + odd]
                word = byte_perm(own + [None, None], sent + [None, None], 0x1504 if odd else 0x5140)
                n = 8 * j + 2 * (lane % 4) + odd
                offset = j * 512 + n % 8 * 16 + warp * 128 + 4 * (lane // 8)
                words.append(offset)
                for k in range(4):
                    assert word[k] is not None and word[k][0] == n and offset + k not in p8, (n_rows, warp, lane, k)
                    p8[offset + k] = word[k]
            assert len({w // 4 % 32 for w in words}) == 32, (n_rows, warp, j, "bank conflict")
    return p8


def main():
    vt = transpose()
    assert len(vt) == 512 * 64
    for n in range(512):  # WGMMA B operand, K-major without swizzle: 8 x 16 B core matrices, LBO 128, SBO VT_STRIDE
        for k in range(64):
            assert vt[n // 8 * VT_STRIDE + k // 16 * 128 + n % 8 * 16 + k % 16] == (slot_token(k), n), (n, k)
    for q in range(4):  # P8: the thread with lane % 4 == q stores tokens 16i + (2q, 2q+1, 8+2q, 9+2q) at 16i + 4q..
        for i in range(4):
            assert [slot_token(16 * i + 4 * q + d) for d in range(4)] == [16 * i + 2 * q + d for d in (0, 1, 8, 9)]
    for n_rows in (16, 32):  # the narrow kernel: P8 as WGMMA's B operand [n_rows x 64], read with LBO 128, SBO 512
        p8 = narrow_p8_stores(n_rows)
        assert len(p8) == n_rows * 64
        for n in range(n_rows):
            for k in range(64):
                assert p8[n // 8 * 512 + k // 16 * 128 + n % 8 * 16 + k % 16] == (n, slot_token(k)), (n_rows, n, k)
    frags = narrow_fragments()
    assert len(frags) == 2 * 4 * 32 * 4 * 2 * 4
    for half in range(2):  # each M tile row is one channel, and the half's 256 channels are its 4 x 64 rows
        assert sorted(narrow_pv_channel(half, mt, w, 4 * j, h) for mt in range(4) for w in range(4) for j in range(8)
                      for h in range(2)) == list(range(256 * half, 256 * half + 256))
    for (half, warp, lane, mt, ks, reg), val in frags.items():
        # A fragment (8-bit, m64nNk32): reg 0 / 2 row lane // 4, reg 1 / 3 row lane // 4 + 8; K 4 (lane % 4) + byte,
        # + 16 for reg 2 / 3; K step ks covers slots 32 ks..32 ks + 31 (P8's B operand at the same slots)
        channel = narrow_pv_channel(half, mt, warp, lane, reg % 2)
        slots = [32 * ks + 16 * (reg // 2) + 4 * (lane % 4) + b for b in range(4)]
        assert val == [(slot_token(k), channel) for k in slots], (half, warp, lane, mt, ks, reg, val)
    print("ok: transpose exact, ldmatrix and stmatrix conflict-free, P8 slot order matches (64-row and narrow kernels),"
          " narrow V^T fragments in A-fragment order")


if __name__ == "__main__":
    main()
