"""Emulates how the sm_90a decode loads Q into WGMMA A fragments (`q_frag` / `qr_frag` in
snapmla_decode_sm90.cu) on byte coordinates.

The ldmatrix.x4 reads from the 128 B-swizzled Q tiles are replayed with the kernel's address formula (keep them in
sync): lane L of warp w gives the row address of matrix L // 8, row L % 8; register i of lane L then holds 4 bytes of
matrix i, row L // 4, bytes 4 (L % 4)..+3 (PTX ldmatrix, b16 elements). Every register must hold the bytes that
WGMMA's A fragment expects there (PTX wgmma register fragments, m64nNk32 8-bit = m64nNk16 16-bit in bytes):
row 16 w + L // 4 (+ 8 for registers 1 and 3), K bytes 32 k + 4 (L % 4) (+ 16 for registers 2 and 3) -- the
register-source A layout that CUTLASS's cute GMMA traits give for 8-bit types (ALayout_64x32) and, in bytes, for
16-bit ones.
Each 8-row ldmatrix phase must touch 8 distinct 16 B bank groups (no bank conflicts).
    usage: python -m tools.kernel_dev.emulate_q_fragments
"""

TILE = 8192  # one swizzled [64 rows x 128 B] tile


def sw128(row: int, byte: int) -> int:
    """The kernel's sw128: byte offset of (row, byte) in 128 B-swizzled tiles placed side by side."""
    return (byte >> 7) * TILE + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def check(row_bytes: int) -> int:
    """Checks all warps, lanes and K steps of a [64 x row_bytes] operand; returns the number of registers checked."""
    where = {sw128(r, b): (r, b) for r in range(64) for b in range(row_bytes)}
    checked = 0
    for warp in range(4):
        for k in range(row_bytes // 32):
            # the kernel's row addresses (frow, fbyte)
            starts = []
            for lane in range(32):
                frow = 16 * warp + (lane % 8) + 8 * ((lane // 8) % 2)
                fbyte = 16 * (lane // 16)
                starts.append(sw128(frow, 32 * k + fbyte))
            for m in range(4):
                assert len({a % 128 // 16 for a in starts[8 * m:8 * m + 8]}) == 8, "bank conflict"
            for lane in range(32):
                for reg in range(4):
                    row_start = starts[8 * reg + lane // 4]  # matrix `reg`, row lane // 4
                    got = [where[row_start + 4 * (lane % 4) + i] for i in range(4)]
                    want_row = 16 * warp + lane // 4 + 8 * (reg % 2)
                    want_byte = 32 * k + 4 * (lane % 4) + 16 * (reg // 2)
                    assert got == [(want_row, want_byte + i) for i in range(4)], (warp, k, lane, reg, got)
                    checked += 1
    return checked


if __name__ == "__main__":
    n = check(512) + check(128)  # content (fp8, 512 B rows), RoPE (bf16, 128 B rows)
    print(f"Q fragments: {n} registers hold the bytes WGMMA's A fragment expects; ldmatrix phases conflict-free")
