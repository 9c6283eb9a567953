"""The prebuilt sm_90a decode (sglang_snapmla.prebuilt): built with nvcc on this GPU-less machine, a library for sm_90a
that exports the C entry point and loads without torch's build machinery, carried by the wheel, and refusing inputs
the kernel cannot take as the torch binding does. (On the GPU, `cuda_ext.load` runs its self-check against the
Triton decode before serving with it.)"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from sglang_snapmla import prebuilt

ROOT = Path(__file__).resolve().parents[2]
MEMBER = "sglang_snapmla/kernels/cuda/prebuilt/libsnapmla_decode_sm90.so"


def _tool(name):
    from tools.kernel_dev.sass_schedule import find_tool

    try:
        return find_tool(name)
    except SystemExit:
        pytest.skip(f"{name} not installed")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return prebuilt.build(tmp_path_factory.mktemp("prebuilt") / "libsnapmla_decode_sm90.so", nvcc=_tool("nvcc"))


def assert_sm90a_decode(path: Path):
    elf = subprocess.run([_tool("cuobjdump"), "-elf", str(path)], capture_output=True, text=True).stdout
    assert "arch = sm_90a" in elf, elf[:2000]
    sass = subprocess.run([_tool("cuobjdump"), "-sass", str(path)], capture_output=True, text=True).stdout
    assert "HGMMA" in sass, "no warpgroup MMA in the library's SASS"


def test_library_is_sm90a_and_exports_the_entry_point(library):
    assert_sm90a_decode(library)
    decode = prebuilt.PrebuiltDecode(library)  # no GPU needed to load it: the CUDA runtime is linked in
    assert decode.lib.snapmla_error_string(1) == b"invalid argument"
    needed = subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    assert "libcudart" not in needed and "libtorch" not in needed, needed


def _split_args(B=2, H=16, S_Q=2, slots=16, splits=3, final=False, table=None, bt_entries=None, **override):
    """The binding's decode_split arguments for B sequences on CPU tensors (a pool of 200 rows, the block table a
    narrowed view of a wider one at an offset, as SGLang's captured views are) -> dict by argument name."""
    R = S_Q * H
    table = table if table is not None else torch.zeros(4, 8, dtype=torch.int32)[1:1 + B, :3]
    empty = torch.empty(0)
    args = dict(q8=torch.zeros(B, S_Q, H, 512, dtype=torch.uint8), q_scale=torch.zeros(B, S_Q, H),
                q_rope=torch.zeros(B, S_Q, H, 64, dtype=torch.bfloat16),
                kv_content=torch.zeros(200, 512, dtype=torch.uint8), kv_scale=torch.zeros(200),
                kv_rope=torch.zeros(200, 64, dtype=torch.bfloat16), block_table=table,
                seq_lens=torch.ones(B, dtype=torch.int32),
                o_part=empty if final else torch.zeros(B, R, slots, 512),
                lse_part=empty if final else torch.zeros(B, R, slots),
                out=torch.zeros(B, S_Q, H, 512, dtype=torch.bfloat16) if final else empty,
                lse_out=torch.zeros(B, H, S_Q) if final else empty, R=R, H=H, S_Q=S_Q, qk_scale_log2=0.5,
                num_splits=1 if final else splits, bt_entries=table.numel() if bt_entries is None else bt_entries,
                launch_flags=0)
    return {**args, **override}


def test_split_params_are_what_the_kernel_reads():
    """DecodeParams as the kernel's address arithmetic reads them: the partials' slots from o_part (wider than the
    splits where the plan pads them), the block table's row stride and not its view's width, the pool's rows."""
    a = _split_args()
    p = prebuilt.split_params(**a)
    assert (p.part_slots, p.num_splits, p.stride_bt, p.pool_rows, p.batch, p.R, p.H, p.S_Q) == (16, 3, 8, 200, 2, 32,
                                                                                               16, 2)
    assert p.bt_entries == 6 and p.block_table == a["block_table"].data_ptr() and p.o_part == a["o_part"].data_ptr()
    assert p.out is None and p.lse_out is None and p.qk_scale_log2 == 0.5
    a = _split_args(final=True)
    p = prebuilt.split_params(**a)
    assert p.part_slots == 1 and p.o_part is None and p.lse_part is None and p.out == a["out"].data_ptr()


@pytest.mark.parametrize("change, message", [
    (dict(q8=torch.zeros(2, 16, 2, 512, dtype=torch.uint8).transpose(1, 2)), "contiguous"),
    (dict(final=True, num_splits=3), "only with num_splits == 1"),
    (dict(final=True, out=torch.zeros(2, 2, 16, 512)), "only with num_splits == 1"),
    (dict(final=True, lse_out=torch.zeros(2, 16, 2, dtype=torch.bfloat16)), "only with num_splits == 1"),
    (dict(o_part=torch.empty(0)), "either the split partials or the final outputs"),
    (dict(slots=2), "slots >= num_splits"),
    (dict(lse_part=torch.zeros(2, 32, 15)), "slots >= num_splits"),
    (dict(table=torch.zeros(2, 3, dtype=torch.int64)), "int32 with unit stride"),
    (dict(table=torch.zeros(3, 2, dtype=torch.int32).t()), "int32 with unit stride"),
    (dict(bt_entries=4 * 8 - 8 + 1), "exceeds the block table's storage"),  # the view starts 8 entries in
    (dict(bt_entries=-1), "exceeds the block table's storage"),
])
def test_split_params_refuse_what_the_binding_refuses(change, message):
    with pytest.raises(RuntimeError, match=message):
        prebuilt.split_params(**_split_args(**change))
    assert prebuilt.split_params(**_split_args(bt_entries=4 * 8 - 8))  # the view's storage, to its end


def test_a_launch_error_names_what_tma_needs():
    describe = {1: b"invalid argument", 2: b"out of memory"}.get
    assert "must be 16-byte aligned; or bf16 Q for fewer than 33 query rows)" in prebuilt.launch_error(1, describe)
    assert prebuilt.launch_error(2, describe) == "snapmla sm90 decode launch failed: out of memory"


def test_load_refuses_a_library_that_fails_its_check_or_cannot_be_checked(monkeypatch, tmp_path):
    (tmp_path / "lib.so").write_bytes(b"")
    monkeypatch.setattr(prebuilt, "LIBRARY", tmp_path / "lib.so")
    monkeypatch.setattr(prebuilt, "PrebuiltDecode", lambda: "the library")
    monkeypatch.setattr(prebuilt, "self_check", lambda module: "3 split(s): rel-L2 0.5 against the spec")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert prebuilt.load.__wrapped__() == (None, "prebuilt library failed its check on this GPU: 3 split(s): rel-L2 "
                                                 "0.5 against the spec")
    monkeypatch.setattr(prebuilt, "self_check", lambda module: None)
    assert prebuilt.load.__wrapped__() == ("the library", None)
    # inside a CUDA-graph capture the check (which synchronizes) is not run, and the library not used
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    module, why = prebuilt.load.__wrapped__()
    assert module is None and "inside a CUDA graph capture" in why


def test_decode_split_refuses_what_the_binding_refuses(library):
    decode = prebuilt.PrebuiltDecode(library)
    t = torch.zeros(1, 4, 512)
    with pytest.raises(RuntimeError, match="CUDA, contiguous tensors expected"):
        decode.decode_split(t, t, t, t, t, t, t.int(), t.int(), t, t, t, t, 4, 4, 1, 1.0, 1, 1, 0)


def test_a_launch_the_library_refuses_raises_its_error(library, monkeypatch):
    """The library's error code (a launch it could not make) is raised with its message, not dropped: tensors that
    say they are on CUDA, the entry point replaced by one that answers 2 (out of memory) without reading them."""
    decode = prebuilt.PrebuiltDecode(library)
    called = []
    decode.fn = lambda params, stream: called.append(stream) or 2
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(prebuilt.torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 7}))
    a = _split_args(final=True)
    with pytest.raises(RuntimeError, match="snapmla sm90 decode launch failed: .+"):
        decode.decode_split(*a.values())
    assert called == [7]


def test_build_runs_nvcc_with_a_static_runtime_and_says_why_it_cannot(monkeypatch, tmp_path):
    """The library links the CUDA runtime statically (it then needs only a driver where it serves); no nvcc, or an
    nvcc that fails, is an error naming the cause, not a missing file later."""
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n")
    fake.chmod(0o755)
    assert prebuilt.build(tmp_path / "lib.so", nvcc=str(fake)) == tmp_path / "lib.so"
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("-cudart") + 1] == "static" and "-shared" in args and "sm_90a" in " ".join(args)
    fake.write_text("#!/bin/sh\necho 'error: no sm_90a' >&2\nexit 2\n")
    with pytest.raises(RuntimeError, match="(?s)nvcc failed .*error: no sm_90a"):
        prebuilt.build(tmp_path / "lib.so", nvcc=str(fake))
    monkeypatch.setattr(prebuilt.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="nvcc not found"):
        prebuilt.build(tmp_path / "lib.so")


def test_the_wheel_carries_the_library(library, tmp_path):
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name) if src.exists() else (src.mkdir(), shutil.copy(ROOT / name, src / name))
    for name in ("sglang_snapmla", "kernels", "study", "harness"):  # the folders beside the package come along
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (src / "kernels/cuda/prebuilt").mkdir(exist_ok=True)  # a checkout where the library was built has the folder
    shutil.copy(library, src / "kernels/cuda/prebuilt" / library.name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("sglang_snapmla-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert MEMBER in z.namelist(), [n for n in z.namelist() if "kernels" in n]
        # the product only: no accuracy study, no test or benchmark support
        shipped = [n for n in z.namelist() if n.endswith(".py")]
        assert all(n.startswith("sglang_snapmla/") for n in shipped), shipped
        assert not {"accuracy.py", "ablations.py", "activations.py", "testing.py", "problems.py"} & \
            {Path(n).name for n in shipped}, shipped
        (tmp_path / "from_wheel.so").write_bytes(z.read(MEMBER))
    assert_sm90a_decode(tmp_path / "from_wheel.so")


def test_without_the_library_load_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setattr(prebuilt, "LIBRARY", tmp_path / "absent.so")
    module, why = prebuilt.load.__wrapped__()
    assert module is None and "python -m sglang_snapmla.prebuilt" in why


def test_the_ctypes_params_mirror_the_headers_struct():
    """prebuilt.DecodeParams is snapmla::DecodeParams field by field: names, order and C types as the header declares
    them (ctypes lays the struct out as the C compiler does from those)."""
    import ctypes
    import re

    from sglang_snapmla import cuda_ext

    header = (cuda_ext.SOURCE_DIR / "snapmla_decode_sm90.h").read_text()
    body = re.search(r"struct DecodeParams \{(.*?)\};", header, re.S).group(1)
    c_types = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "float": ctypes.c_float}
    declared = [(name, ctypes.c_void_p if ctype.endswith("*") else c_types[ctype])
                for ctype, name in re.findall(r"^\s*((?:const )?\w+\*?) (\w+);", body, re.M)]
    assert len(declared) == body.count(";") and declared == prebuilt.DecodeParams._fields_


def test_a_library_built_with_another_params_layout_is_refused(library, monkeypatch):
    """The library reports sizeof(DecodeParams) as it was built; a loader whose mirror differs (a library from
    another revision of the header) refuses it instead of passing it misplaced fields."""
    import ctypes

    class Longer(prebuilt.DecodeParams):
        _fields_ = [("added", ctypes.c_int64)]

    monkeypatch.setattr(prebuilt, "DecodeParams", Longer)
    with pytest.raises(RuntimeError, match="rebuild it"):
        prebuilt.PrebuiltDecode(library)


class _TritonAsLibrary:
    """A stand-in for the library's `decode_split` (the binding's argument list) that runs the Triton decode, as a
    correct library would decode; `garbage` makes it write random outputs instead, as a library that loads but
    computes wrong would; `skewed_partials` scales its split partials, as one whose multi-split path is wrong would."""

    def __init__(self, garbage: bool = False, skewed_partials: bool = False, scale: float = 1.0,
                 rows_by_splits: bool = False):
        self.garbage, self.skewed_partials, self.scale = garbage, skewed_partials, scale
        self.rows_by_splits = rows_by_splits  # partial rows `splits` slots apart whatever o_part's slots

    def decode_split(self, q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part,
                     out, lse, R, H, S_Q, qk_scale_log2, splits, bt_entries, launch_flags):
        from sglang_snapmla import ops

        if self.garbage:
            for t in (o_part, lse_part, out, lse):
                t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(1)).to(t.dtype))
            return
        if self.rows_by_splits and splits > 1:
            packed = o_part[:, :, :splits].contiguous(), lse_part[:, :, :splits].contiguous()
            self.rows_by_splits = False
            self.decode_split(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, *packed,
                              out, lse, R, H, S_Q, qk_scale_log2, splits, bt_entries, launch_flags)
            self.rows_by_splits = True
            for whole, part in zip((o_part, lse_part), packed):
                whole.view(-1)[:part.numel()].copy_(part.view(-1))
            return
        ops.launch_triton_decode(q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part,
                                 lse_part, out, lse, qk_scale_log2 / 1.4426950408889634, splits)
        if self.skewed_partials:
            o_part.mul_(1.5)
        for t in (o_part, out):  # a decode off by a constant factor (a wrong scale folded in)
            t.mul_(self.scale)


@pytest.mark.cpu_interpreter
def test_start_up_check_passes_a_right_decode_and_names_a_wrong_one():
    """The check the server runs before it trusts the prebuilt library (`prebuilt.load`), on CPU tensors through
    Triton's interpreter with an injected decode: a decode that computes what the Triton kernel computes passes the
    comparison with the spec, one that writes garbage is named with its error, and one whose split partials are off
    (its one-split outputs right) is named at three splits."""
    assert prebuilt.self_check(_TritonAsLibrary(), device="cpu") is None
    problem = prebuilt.self_check(_TritonAsLibrary(garbage=True), device="cpu")
    assert problem is not None and problem.startswith("1 split(s): rel-L2") and "against the spec" in problem
    problem = prebuilt.self_check(_TritonAsLibrary(skewed_partials=True), device="cpu")
    assert problem is not None and problem.startswith("3 split(s): rel-L2")
    # a library that spaces the partial rows by the split count, not by the slots it is given (a server's padded
    # partials, decode_plan.partial_slots), is named too
    problem = prebuilt.self_check(_TritonAsLibrary(rows_by_splits=True), device="cpu")
    assert problem is not None and problem.startswith("3 split(s): rel-L2")
    # within the band between a right decode and garbage: outputs 5 % off are named
    problem = prebuilt.self_check(_TritonAsLibrary(scale=1.05), device="cpu")
    assert problem is not None and problem.startswith("1 split(s): rel-L2 0.05")
    # outputs that are not numbers fail it too (no comparison with NaN is true)
    problem = prebuilt.self_check(_TritonAsLibrary(scale=float("nan")), device="cpu")
    assert problem is not None and problem.startswith("1 split(s): rel-L2 nan")


def test_start_up_check_bound_is_twice_the_measured_kernel_error():
    """SELF_CHECK_REL_L2 comes from the CUDA decode's error against the spec measured over the seed sweep's small
    cases (results/bench), with the stated margin of 2: the constant is that sweep's maximum, not a loosened guess."""
    from pathlib import Path

    from harness.results import read_json

    sweep = read_json(Path(__file__).resolve().parents[2] / "results/bench/decode_seed_sweep_small_cases.json")
    measured = max(d["cuda_rel_l2"] for case in sweep if case["outlier"] is None for d in case["draws"])
    assert measured <= prebuilt.MEASURED_MAX_REL_L2 <= measured * 1.01
    assert prebuilt.SELF_CHECK_REL_L2 == 2 * prebuilt.MEASURED_MAX_REL_L2 < 0.05
