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


def test_decode_split_refuses_what_the_binding_refuses(library):
    decode = prebuilt.PrebuiltDecode(library)
    t = torch.zeros(1, 4, 512)
    with pytest.raises(RuntimeError, match="CUDA, contiguous tensors expected"):
        decode.decode_split(t, t, t, t, t, t, t.int(), t.int(), t, t, t, t, 4, 4, 1, 1.0, 1, 1, 0)


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

    def __init__(self, garbage: bool = False, skewed_partials: bool = False, scale: float = 1.0):
        self.garbage, self.skewed_partials, self.scale = garbage, skewed_partials, scale

    def decode_split(self, q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part,
                     out, lse, R, H, S_Q, qk_scale_log2, splits, bt_entries, launch_flags):
        from sglang_snapmla import ops

        if self.garbage:
            for t in (o_part, lse_part, out, lse):
                t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(1)).to(t.dtype))
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
    # within the band between a right decode and garbage: outputs 5 % off are named
    problem = prebuilt.self_check(_TritonAsLibrary(scale=1.05), device="cpu")
    assert problem is not None and problem.startswith("1 split(s): rel-L2 0.05")


def test_start_up_check_bound_is_twice_the_measured_kernel_error():
    """SELF_CHECK_REL_L2 comes from the CUDA decode's error against the spec measured over the seed sweep's small
    cases (results/bench), with the stated margin of 2: the constant is that sweep's maximum, not a loosened guess."""
    from pathlib import Path

    from harness.results import read_json

    sweep = read_json(Path(__file__).resolve().parents[2] / "results/bench/decode_seed_sweep_small_cases.json")
    measured = max(d["cuda_rel_l2"] for case in sweep if case["outlier"] is None for d in case["draws"])
    assert measured <= prebuilt.MEASURED_MAX_REL_L2 <= measured * 1.01
    assert prebuilt.SELF_CHECK_REL_L2 == 2 * prebuilt.MEASURED_MAX_REL_L2 < 0.05
