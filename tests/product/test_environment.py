"""`python -m sglang_snapmla`: the environment report, one test per branch of what it decides."""

import subprocess
import sys

import pytest

from helpers import fake_gpus
from sglang_snapmla import cuda_ext, environment, prebuilt, sglang_release

# read before any test fakes a GPU: importing SGLang probes the CUDA driver once torch says a GPU is there
REFUSED = sglang_release.refusal(sglang_release.installed())


def _gpu(monkeypatch, capability=(9, 0), name="NVIDIA H200", count=1):
    fake_gpus(monkeypatch, {i: (capability, name) for i in range(count)})
    monkeypatch.setattr(cuda_ext, "unavailable_reason",
                        lambda: None if capability == (9, 0) else f"needs an sm_90 GPU, found sm_{capability[0]}0")


def _cuda_home(monkeypatch, home):
    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(ext, "CUDA_HOME", home)


def test_module_entry_point_on_a_machine_without_a_gpu():
    """On a CPU-only machine (CI) the command runs, names the missing GPU and exits 1."""
    res = subprocess.run([sys.executable, "-m", "sglang_snapmla"], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "decode: none (no CUDA GPU" in res.stdout
    assert "serve: sglang serve --model-path <checkpoint> --attention-backend snapmla" in res.stdout
    assert "TRITON_CACHE_DIR=" in res.stdout and "cannot serve here: no CUDA GPU" in res.stdout
    assert "\nGPU: none\n" in res.stdout


@pytest.mark.parametrize("version, says", [("0.5.17", "SGLang 0.5.17: supported (verified on GPUs)"),
                                           ("0.5.23", "SGLang 0.5.23: supported (CPU-verified)")])
def test_each_supported_sglang_is_named_with_where_it_is_verified(monkeypatch, version, says):
    assert sglang_release.GPU_VERIFIED == "0.5.17"
    _gpu(monkeypatch)
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), None))
    monkeypatch.setattr(environment, "_version", lambda p: version if p == "sglang" else "1.0")
    lines, status = environment.report()
    assert says in lines and status == 0


def test_prebuilt_library_serves_on_sm90(monkeypatch):
    _gpu(monkeypatch, count=8)
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), None))
    lines, status = environment.report()
    text = "\n".join(lines)
    assert "decode: sm_90a prebuilt" in text and "GPU 7: NVIDIA H200, sm_90" in text
    assert "--attention-backend snapmla --tp 8" in text
    assert status == (0 if REFUSED is None else 1)


def test_nvcc_build_where_no_library_is_shipped(monkeypatch):
    _gpu(monkeypatch)
    monkeypatch.setattr(prebuilt, "load", lambda: (None, "no prebuilt library"))
    _cuda_home(monkeypatch, "/usr/local/cuda")
    decode = environment.decode_choice()
    assert decode.kind == "sm_90a built with nvcc" and "/usr/local/cuda" in decode.why


@pytest.mark.parametrize("requested,kind", [("auto", "Triton"), ("cuda", "none")])
def test_no_library_and_no_nvcc(monkeypatch, requested, kind):
    """auto falls back to Triton (and says why); cuda makes the missing kernel a reason not to serve."""
    _gpu(monkeypatch)
    monkeypatch.setenv("SNAPMLA_DECODE_IMPL", requested)
    monkeypatch.setattr(prebuilt, "load", lambda: (None, "no prebuilt library"))
    _cuda_home(monkeypatch, None)
    decode = environment.decode_choice()
    assert decode.kind == kind and "no nvcc" in decode.why
    lines, status = environment.report()
    assert (status == 1) == (kind == "none") or REFUSED


@pytest.mark.parametrize("capability,name", [((8, 9), "NVIDIA L40S"), ((10, 0), "NVIDIA B200")])
def test_other_fp8_gpus_run_the_triton_decode(monkeypatch, capability, name):
    _gpu(monkeypatch, capability=capability, name=name)
    monkeypatch.setattr(prebuilt, "load", lambda: pytest.fail("the sm_90a library is not for this GPU"))
    decode = environment.decode_choice()
    assert decode.kind == "Triton" and f"sm_{capability[0]}0" in decode.why


@pytest.mark.parametrize("capability,name", [((8, 0), "NVIDIA A100-SXM4-80GB"), ((8, 6), "NVIDIA A10")])
def test_gpus_without_fp8_cannot_serve(monkeypatch, capability, name):
    """Triton compiles FP8 e4m3 from sm_89 on (tests/product/test_compile_sm90.py holds it to that): an A100 or an A10
    is named as a reason not to serve, not reported as running the Triton decode."""
    _gpu(monkeypatch, capability=capability, name=name, count=2)
    monkeypatch.setattr(prebuilt, "load", lambda: pytest.fail("the sm_90a library is not for this GPU"))
    decode = environment.decode_choice()
    sm = f"sm_{capability[0]}{capability[1]}"
    assert decode.kind == "none" and f"GPU 0 ({name}) is {sm}" in decode.why and "capability 8.9" in decode.why
    lines, status = environment.report()
    assert status == 1 and any(line.startswith("cannot serve here: --attention-backend snapmla computes in FP8")
                               for line in lines), lines


def test_triton_by_request(monkeypatch):
    _gpu(monkeypatch)
    monkeypatch.setenv("SNAPMLA_DECODE_IMPL", "triton")
    assert environment.decode_choice() == environment.Decode("Triton", "SNAPMLA_DECODE_IMPL=triton")


def test_unsupported_sglang_is_named_with_the_fix(monkeypatch):
    _gpu(monkeypatch)
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), None))
    monkeypatch.setattr(environment, "_version", lambda p: "0.5.19" if p == "sglang" else "1.0")
    lines, status = environment.report()
    text = "\n".join(lines)
    assert status == 1 and "SGLang 0.5.19: NOT supported" in text
    assert f"pip install sglang=={sglang_release.SUPPORTED[-1]}" in text


def test_one_gpu_serves_without_tp_and_the_flashinfer_cache_is_its_own_folder(monkeypatch, tmp_path):
    """The serve line names --tp only for several GPUs; FlashInfer's variable names the folder above the cache it
    fills (`.cache/flashinfer` under it), which the report gives as both."""
    _gpu(monkeypatch)
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), None))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    assert ("FlashInfer JIT (SGLang's norms, sampling, prefill)", "FLASHINFER_WORKSPACE_BASE",
            tmp_path / ".cache" / "flashinfer") in environment.cache_folders()
    lines, _ = environment.report()
    assert "serve: sglang serve --model-path <checkpoint> --attention-backend snapmla" in lines
    assert f"  FLASHINFER_WORKSPACE_BASE={tmp_path}  (FlashInfer JIT (SGLang's norms, sampling, prefill): " \
           f"{tmp_path / '.cache' / 'flashinfer'})" in lines


def test_no_sglang_installed_is_a_reason_not_to_serve(monkeypatch):
    _gpu(monkeypatch)
    monkeypatch.setattr(prebuilt, "load", lambda: (object(), None))
    real = environment._version
    monkeypatch.setattr(environment, "_version", lambda package: None if package == "sglang" else real(package))
    lines, status = environment.report()
    assert status == 1 and "SGLang: not installed" in lines
    assert f"cannot serve here: SGLang is not installed: {sglang_release.install_fix()}" in lines


@pytest.mark.parametrize("switch,value", [("SNAPMLA_DECODE_IMPL", "sm90"), ("SNAPMLA_PDL", "off")])
def test_a_switch_set_to_a_value_it_does_not_take_is_a_reason_not_to_serve(monkeypatch, switch, value):
    """The report names it once, with the values it takes, and exits non-zero (a decode switch included: the
    report then has no decode to name)."""
    monkeypatch.setenv(switch, value)
    lines, status = environment.report()
    refusals = [ln for ln in lines if ln.startswith(f"cannot serve here: {switch}={value!r}: set it to")]
    assert status == 1 and len(refusals) == 1, lines
