"""tools/kernel_dev/sass_schedule.py: the run-length instruction sequence of cuobjdump's SASS and the SFU work placed
before each group of WGMMAs."""

import pytest

from sglang_snapmla.cuda_ext import SOURCE_DIR
from tools.kernel_dev import sass_schedule as ss


def _sass(function: str, ops: list[str], start: int = 0x100) -> str:
    lines = [f"\t\tFunction : {function}"]
    for i, op in enumerate(ops):
        lines.append(f"        /*{start + 16 * i:04x}*/                   {op} ;   /* 0x0000000000000000 */")
    return "\n".join(lines)


# one page of the softmax loop as ptxas lays it out: part 1, pass 1 (LG2), pass 2 (shuffles, EX2, with a predicated
# instruction and an unrelated one in between), part 2 with one EX2 slotted inside it, then the wait
PAGE = (["QGMMA.64x64x32.F32.E4M3.E4M3 R24, R164, gdesc[UR8], RZ, !UPT"] * 2 + ["SYNCS.PHASECHK.TRANS64 P0, [UR4], R3"]
        + ["MUFU.LG2 R176, R172"] * 3 + ["FMNMX R1, R2, R3, !PT"] + ["SHFL.BFLY PT, R14, R87, 0x1, 0x1f"] * 2
        + ["@P1 MUFU.EX2 R13, R13"] + ["MUFU.EX2 R14, R14"] * 3 + ["MUFU.RCP R5, R6"]
        + ["QGMMA.64x64x32.F32.E4M3.E4M3 R56, R96, gdesc[UR20], RZ, !UPT"] * 2 + ["MUFU.EX2 R17, R17"]
        + ["HGMMA.64x64x16.F32.BF16 R56, R128, gdesc[UR20], R56"] + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"])


def test_the_sequence_merges_runs_per_function_in_address_order():
    seq = ss.sequence(_sass("kernel_a", PAGE) + "\n" + _sass("kernel_b", ["MUFU.EX2 R1, R1", "BRA 0x10"]))
    assert seq["kernel_a"] == [["QGMMA", 2], ["SYNCS.PHASECHK", 1], ["MUFU.LG2", 3], ["SHFL.BFLY", 2],
                               ["MUFU.EX2", 4], ["MUFU.RCP", 1], ["QGMMA", 2], ["MUFU.EX2", 1], ["HGMMA", 1],
                               ["WARPGROUP.DEPBAR", 1]]
    assert seq["kernel_b"] == [["MUFU.EX2", 1]]  # other opcodes are not part of the schedule's reading


def test_each_tensor_group_counts_the_sfu_work_placed_before_it():
    groups = ss.tensor_groups(ss.sequence(_sass("k", PAGE))["k"])
    assert groups == [{"qgmma": 2, "hgmma": 0, "lg2": 0, "shfl": 0, "ex2": 0, "rcp": 0},
                      # part 2 after pass 2: 3 LG2, both shuffles and 4 EX2 before it; the EX2 slotted inside the
                      # group is not counted
                      {"qgmma": 2, "hgmma": 1, "lg2": 3, "shfl": 2, "ex2": 4, "rcp": 1}]


def test_the_compiled_decode_has_the_softmax_loops_two_qk_parts(tmp_path):
    """On the shipped source (needs nvcc and a cuobjdump, Triton's bundled one will do): the page loop's QK part 1
    (8 FP8 WGMMAs) and part 2 (8 FP8 + 4 BF16 RoPE WGMMAs, after pass 1's 16 LG2 per thread) are found."""
    for tool in ("nvcc", "cuobjdump"):
        try:
            ss.find_tool(tool)
        except SystemExit:
            pytest.skip(f"{tool} not installed")
    cubin, registers = ss.build_cubin(SOURCE_DIR, tmp_path)
    assert "Used" in registers
    functions = ss.sequence(ss.disassemble(cubin))
    wide = {name: runs for name, runs in functions.items() if "decode_split_sm90_kernel" in name}
    narrow = {name: runs for name, runs in functions.items() if "decode_narrow_sm90_kernel" in name}
    # final outputs or partials, each with Q by TMA or quantized in the kernel; the narrow kernel at N = 16 and 32
    assert len(wide) == 4 and len(narrow) == 4
    for runs in wide.values():
        groups = ss.tensor_groups(runs)
        assert any(g["qgmma"] == 8 and g["hgmma"] == 0 for g in groups)
        assert any(g["qgmma"] == 8 and g["hgmma"] == 4 and g["lg2"] >= 16 for g in groups)
    for runs in narrow.values():  # QK issued whole (16 FP8 + 4 BF16 WGMMAs), PV as 8 FP8 WGMMAs per page
        groups = ss.tensor_groups(runs)
        assert any(g["qgmma"] == 16 and g["hgmma"] == 4 for g in groups), groups
        assert any(g["qgmma"] == 8 and g["hgmma"] == 0 for g in groups), groups
