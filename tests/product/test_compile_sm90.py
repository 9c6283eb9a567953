"""Every kernel compiles for sm_90 / sm_90a on this (GPU-less) machine: catches compiler-only errors early."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def test_kernels_compile_for_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0")  # the interpreter replaces @jit functions; compile needs the real ones
    script = Path(__file__).resolve().parents[1] / "support" / "compile_sm90.py"
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    # 6 quantize_q (1-16 rows a program, with PDL; 16 rows without), append, fetch, 5 decode_split, 2 combine
    assert res.stdout.count(": ok") == 15, res.stdout
    # the Q-quant blocks the plan may pick keep 4+ programs of 128 threads an SM and spill nothing
    from sglang_snapmla import decode_plan

    usage = {int(rows): (int(regs), int(local)) for rows, regs, local in re.findall(
        r"quantize_q ROWS=(\d+) PDL=True: ok .* registers (\d+), local (\d+) B", res.stdout)}
    if not usage:
        pytest.skip("no cuobjdump: registers not read")
    for rows, (regs, local) in usage.items():
        if rows <= decode_plan.Q_QUANT_MAX_ROWS:
            assert regs <= 128 and local == 0, (rows, regs, local)


# each kernel variant without PDL (griddepcontrol is sm_90's) compiled for one capability: "NAME: ok" or "NAME: why"
AT_CAPABILITY = """
import sys
from triton.backends.compiler import GPUTarget
sys.path.insert(0, sys.argv[1])
import compile_sm90 as c
c.TARGET = GPUTarget("cuda", int(sys.argv[2]), 32)
for name, fn, sig, consts, opts in c.variants():
    if consts.get("PDL"):
        continue
    try:
        c.compile_one(fn, sig, consts, **opts)
        print(f"{name}: ok")
    except Exception as e:
        print(f"{name}: {str(e).strip().splitlines()[-1]}")
"""


def test_the_kernels_compile_from_the_capability_snapmla_serves_on():
    """`gpu.FP8_MIN_CAPABILITY` is where Triton starts to compile the kernels: at 8.9 (Ada) every kernel compiles, at
    8.6 (the newest before it: A10, RTX 3090) every kernel that touches the cache fails on its FP8 e4m3 type, so a
    server there is refused at startup (`gpu.unsupported_gpu`) instead of failing at its first compile."""
    from sglang_snapmla.gpu import FP8_MIN_CAPABILITY

    support = str(Path(__file__).resolve().parents[1] / "support")
    env = dict(os.environ, TRITON_INTERPRET="0")
    lowest = FP8_MIN_CAPABILITY[0] * 10 + FP8_MIN_CAPABILITY[1]
    out = {}
    for cap in (lowest, 86):
        res = subprocess.run([sys.executable, "-c", AT_CAPABILITY, support, str(cap)], env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        out[cap] = dict(line.split(": ", 1) for line in res.stdout.strip().splitlines())
    assert len(out[lowest]) == 9 and set(out[lowest].values()) == {"ok"}, out[lowest]
    fp8 = [name for name in out[86] if not name.startswith("combine")]  # the combine reads fp32 partials only
    assert len(fp8) == 8 and all("fp8e4nv not supported" in out[86][name] for name in fp8), out[86]


ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "kernels" / "cuda"


def _nvcc():
    from tools.kernel_dev.sass_schedule import find_tool

    try:
        return find_tool("nvcc")
    except SystemExit:
        pytest.skip("nvcc not installed")


def test_cuda_decode_compiles_for_sm90a(tmp_path):
    """The sm_90a CUDA decode compiles with nvcc on a GPU-less machine (no torch headers needed), and its PTX uses
    FP8 and BF16 WGMMA (the point of the kernel)."""
    nvcc = _nvcc()
    src = CUDA_DIR / "snapmla_decode_sm90.cu"
    ptx = tmp_path / "decode.ptx"
    res = subprocess.run([nvcc, "-std=c++17", "-O3", "-arch=sm_90a", "-ptx", "-o", str(ptx), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    text = ptx.read_text()
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3" in text
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in text
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in text
    for n in (16, 32):  # the narrow kernel (<= 32 query rows): query rows as N
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3" in text
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16" in text
    assert ".entry _ZN7snapmla25decode_narrow_sm90_kernel" in text
    res = subprocess.run([nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                          "-Xptxas", "-v", "-o", str(tmp_path / "decode.cubin"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    print(res.stderr)  # registers / spills, for the record (pytest -s)


def test_wgmma_wrappers_are_generated_from_the_script():
    from tools.kernel_dev import gen_wgmma

    expected = "".join(gen_wgmma.wrapper(*s) for s in gen_wgmma.SHAPES)
    assert expected in (CUDA_DIR / "wgmma_ops.cuh").read_text()


def test_cuda_extension_builds_and_imports_without_a_gpu(tmp_path):
    """The torch binding + kernel build through torch's extension machinery (what a GPU host does at first use)."""
    _nvcc()
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if not (Path(cuda_home) / "include" / "cuda_runtime_api.h").exists():
        pytest.skip(f"no CUDA headers under {cuda_home}")
    code = ("import sys; from sglang_snapmla import cuda_ext; "
            "m = cuda_ext.build(sys.argv[1]); print('BUILT', callable(m.decode_split))")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, CUDA_HOME=cuda_home))
    assert "BUILT True" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]


def test_v_transpose_mapping_emulated():
    """The decode's ldmatrix/stmatrix V transpose, replayed on byte coordinates, fills V^T in the slot order P8 uses,
    without shared-memory bank conflicts, and the narrow kernel's P8 word stores (one byte pair traded between lanes
    4 apart) put each (query row, token) where its PV WGMMA reads that token's V^T column, each store on 32 banks,
    and the narrow kernel's V^T register fragments hold every byte where the m64nNk32 A fragment expects it, at the
    channel `narrow_pv_channel` names (tools/kernel_dev/emulate_transpose.py)."""
    res = subprocess.run([sys.executable, "-m", "tools.kernel_dev.emulate_transpose"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0 and "ok:" in res.stdout, res.stdout + res.stderr


def test_narrow_row_reductions_emulated():
    """The narrow decode's per-row reductions by halves over a warp (page maxima, l), replayed on 32 lanes of fp32,
    equal a plain butterfly's bit for bit, store each query row once, and the shuffles that hand each row's page
    reference back read the lane that reduced it (tools/kernel_dev/emulate_narrow_rows.py)."""
    res = subprocess.run([sys.executable, "-m", "tools.kernel_dev.emulate_narrow_rows"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0 and "ok:" in res.stdout, res.stdout + res.stderr


def test_q_fragment_loads_emulated():
    """The decode's ldmatrix loads of Q into WGMMA A fragments, replayed on byte coordinates, put every byte where the A
    fragment expects it, without shared-memory bank conflicts (tools/kernel_dev/emulate_q_fragments.py)."""
    res = subprocess.run([sys.executable, "-m", "tools.kernel_dev.emulate_q_fragments"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0 and "registers hold the bytes" in res.stdout, res.stdout + res.stderr


def test_source_dir_override_builds_a_separately_named_extension(monkeypatch, tmp_path):
    """SNAPMLA_CUDA_SOURCE_DIR (kernel A/B runs) compiles another copy of kernels/cuda under its own extension name,
    so torch's build cache keeps both versions; without it the shipped sources build as `snapmla_sm90`."""
    import torch.utils.cpp_extension as cpp

    from sglang_snapmla import cuda_ext

    calls = []
    monkeypatch.setattr(cpp, "load", lambda **kw: calls.append(kw) or "module")
    monkeypatch.delenv(cuda_ext.SOURCE_DIR_ENV, raising=False)
    assert cuda_ext.build() == "module"
    monkeypatch.setenv(cuda_ext.SOURCE_DIR_ENV, str(tmp_path))
    cuda_ext.build()
    shipped, variant = calls
    assert shipped["name"] == "snapmla_sm90" and shipped["sources"][1].startswith(str(cuda_ext.SOURCE_DIR))
    assert variant["name"].startswith("snapmla_sm90_") and variant["name"] != shipped["name"]
    assert all(s.startswith(str(tmp_path)) for s in variant["sources"])
    assert variant["extra_include_paths"] == [str(tmp_path)]


@pytest.mark.parametrize("available,capability,reason", [
    (False, None, "no CUDA device"), (True, (9, 0), None),
    (True, (10, 0), "needs an sm_90 GPU (H100/H200), found sm_100"),  # sm_90a code does not run on Blackwell
    (True, (8, 9), "needs an sm_90 GPU (H100/H200), found sm_89")])
def test_the_sm90a_decode_runs_on_sm90_alone(monkeypatch, available, capability, reason):
    import torch

    from sglang_snapmla import cuda_ext

    def capability_of_this_gpu():
        assert available, "the capability asked of a machine without a CUDA device"
        return capability

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of_this_gpu)
    assert cuda_ext.unavailable_reason() == reason


def test_a_source_dir_override_builds_and_never_loads_the_shipped_library(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as cpp

    from sglang_snapmla import cuda_ext, prebuilt

    monkeypatch.setattr(cuda_ext, "unavailable_reason", lambda: None)
    monkeypatch.setattr(cpp, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), ""))  # a shipped library that would pass its check
    monkeypatch.delenv(cuda_ext.SOURCE_DIR_ENV, raising=False)
    assert cuda_ext.locate()[0] == "prebuilt"
    monkeypatch.setenv(cuda_ext.SOURCE_DIR_ENV, str(tmp_path))
    assert cuda_ext.locate() == ("build", None, "kernel development build")


@pytest.mark.parametrize("kind", ["prebuilt", "build", "build fails", "unavailable"])
def test_load_returns_the_decode_or_logs_why_the_triton_one_runs(monkeypatch, caplog, kind):
    """`cuda_ext.load`: the shipped library, else the extension built with nvcc; a build that raises (any error:
    nvcc, the linker, the import) or no way to build leaves None and one warning naming the reason, and the Triton
    decode runs."""
    import logging

    from sglang_snapmla import cuda_ext

    library, built = object(), object()
    located = {"prebuilt": ("prebuilt", library, ""), "unavailable": ("unavailable", None, "no CUDA device")}
    monkeypatch.setattr(cuda_ext, "locate", lambda: located.get(kind, ("build", None, "no library for this torch")))

    def build():
        if kind == "build fails":
            raise RuntimeError("Error building extension 'snapmla_sm90'")
        return built

    monkeypatch.setattr(cuda_ext, "build", build)
    cuda_ext.load.cache_clear()
    caplog.set_level(logging.INFO, logger=cuda_ext.__name__)
    try:
        got = cuda_ext.load()
    finally:
        cuda_ext.load.cache_clear()  # the next caller locates the decode on its own machine again
    said = [r.getMessage() for r in caplog.records]
    expected = {"prebuilt": library, "build": built}.get(kind)
    assert got is expected
    if expected is not None:
        assert any(m.startswith("SnapMLA decode: sm_90a CUDA kernel") for m in said), said
        return
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "using the Triton kernels" in warnings[0], said
    why = ("no library for this torch; build failed: RuntimeError(\"Error building extension 'snapmla_sm90'\")"
           if kind == "build fails" else "no CUDA device")
    assert f"unavailable ({why})" in warnings[0], warnings
