"""Emulates the narrow decode's per-row reductions over a warp (`reduce_rows_by_halves`, `reduced_index`,
`reducing_lane` in snapmla_decode_sm90.cu; keep them in sync) on 32 lanes of fp32.

A thread holds kCols = kN / 4 query rows (row `8 (i // 2) + 2 (lane % 4) + i % 2` for its i-th), and a row's values
of a warp lie in the 8 lanes of equal lane % 4. The kernel reduces them by halves (at lane distances 4, 8, 16 a lane
keeps half of its rows and receives the partner's partials of them), leaving each lane with one row's result, then
gives every lane each of its rows' results back by a shuffle from `reducing_lane`. Checked for kN = 16 and 32, with
max and with fp32 sums on random values: every lane's result equals a plain butterfly's (xor 4, 8, 16) for its row,
bit for bit; the lanes that store (all at kN = 32, lane bit 4 clear at kN = 16) hold each row exactly once; and
`reducing_lane` names a lane of the same warp holding the row asked for.
    usage: python -m tools.kernel_dev.emulate_narrow_rows
"""

import numpy as np


def row_of(i: int, lane: int) -> int:
    """The query row of a thread's i-th column (the kernel's col(i))."""
    return 8 * (i // 2) + 2 * (lane % 4) + i % 2


def reduced_index(n_cols: int, lane: int) -> int:
    b2, b3, b4 = (lane >> 2) & 1, (lane >> 3) & 1, (lane >> 4) & 1
    return 4 * b2 + 2 * b3 + b4 if n_cols == 8 else 2 * b2 + b3


def reducing_lane(n_cols: int, i: int, lane: int) -> int:
    if n_cols == 8:
        return (lane & 3) | ((i >> 2) << 2) | (((i >> 1) & 1) << 3) | ((i & 1) << 4)
    return (lane & 3) | ((i >> 1) << 2) | ((i & 1) << 3)


def shfl_xor(values, distance: int):
    return [values[lane ^ distance] for lane in range(32)]


def reduce_by_halves(v, n_cols: int, op):
    """v[lane][i] (np.float32) -> [lane] the kernel's reduce_rows_by_halves: at lane distance 4, 8, 16 (bit 2, 3, 4)
    a lane whose bit is set keeps the upper half of the partials it carries and sends the lower half (the other lanes
    the reverse); once a lane carries one partial, the remaining steps are plain butterfly steps."""
    cur = [list(row) for row in v]
    for bit, distance in ((2, 4), (3, 8), (4, 16)):
        half = len(cur[0]) // 2
        if half == 0:
            got = shfl_xor([c[0] for c in cur], distance)
            cur = [[op(cur[L][0], got[L])] for L in range(32)]
            continue
        upper = [(L >> bit) & 1 for L in range(32)]
        nxt = [[None] * half for _ in range(32)]
        for k in range(half):
            got = shfl_xor([cur[L][k] if upper[L] else cur[L][half + k] for L in range(32)], distance)
            for L in range(32):
                nxt[L][k] = op(cur[L][half + k] if upper[L] else cur[L][k], got[L])
        cur = nxt
    return [c[0] for c in cur]


def butterfly(v, n_cols: int, op):
    """The plain butterfly of every row (3 shuffles per row): [lane][i]."""
    out = [list(row) for row in v]
    for distance in (4, 8, 16):
        for i in range(n_cols):
            got = shfl_xor([out[L][i] for L in range(32)], distance)
            for L in range(32):
                out[L][i] = op(out[L][i], got[L])
    return out


def check(n_rows: int, op, rng) -> None:
    n_cols = n_rows // 4
    v = [[np.float32(x) for x in rng.standard_normal(n_cols) * np.float32(2.0) ** rng.integers(-20, 20)]
         for _ in range(32)]
    mine, plain = reduce_by_halves(v, n_cols, op), butterfly(v, n_cols, op)
    stored = {}
    for lane in range(32):
        i = reduced_index(n_cols, lane)
        row = row_of(i, lane)
        assert mine[lane] == plain[lane][i] and mine[lane].dtype == np.float32, (n_rows, lane, row)
        if n_rows == 32 or not lane & 16:
            assert row not in stored, (n_rows, "row stored twice", row)
            stored[row] = mine[lane]
        for j in range(n_cols):  # the shuffle back: the named lane holds row j of this lane
            src = reducing_lane(n_cols, j, lane)
            assert row_of(reduced_index(n_cols, src), src) == row_of(j, lane), (n_rows, lane, j, src)
            assert mine[src] == plain[lane][j], (n_rows, lane, j)
    assert sorted(stored) == list(range(n_rows)), (n_rows, sorted(stored))


def main():
    rng = np.random.default_rng(0)
    for _ in range(20):
        for n_rows in (16, 32):
            check(n_rows, np.maximum, rng)
            check(n_rows, lambda x, y: np.float32(x + y), rng)
    print("ok: row reductions by halves equal the butterfly bit for bit, each row stored once, shuffle sources right "
          "(16 and 32 rows)")


if __name__ == "__main__":
    main()
