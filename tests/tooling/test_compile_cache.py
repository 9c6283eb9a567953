"""tools/gpu_host/compile_cache.sh: a GPU host's JIT caches saved as one archive under $OUT and restored, once, on the
next host from the carried seed, with the modification times ninja compares (run here on stand-in cache files)."""

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools/gpu_host/compile_cache.sh"
OLD = 1_700_000_000  # a build's time, older than now


def run(cwd: Path, verb: str, out: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out or cwd / "out")}
    return subprocess.run(["bash", str(SCRIPT), verb], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def write(path: Path, data: bytes, mtime: int = OLD) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def test_a_saved_cache_restores_once_with_its_times_and_without_the_bytecode(tmp_path):
    host = tmp_path / "host"
    cache = host / ".gpucache"
    kept = {"triton/ABC/quantize_q_kernel.cubin": b"cubin" * 100,
            ".cache/flashinfer/0.6/90a/cached_ops/sampling/sampling.so": b"so" * 1000,
            ".cache/flashinfer/0.6/90a/cached_ops/sampling/.ninja_log": b"# ninja log v5\n"}
    for rel, data in kept.items():
        write(cache / rel, data)
    write(cache / "pycache/sglang/x.cpython-312.pyc", b"bytecode")
    saved = run(host, "save")
    assert saved.returncode == 0 and "compile_cache: saved" in saved.stdout, saved.stderr
    archive = host / "out/compile-cache.tar.xz"
    with tarfile.open(archive) as tar:
        names = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
    assert names == set(kept)

    fresh = tmp_path / "fresh"
    seed = fresh / ".gpucache-seed/compile-cache.tar.xz"
    seed.parent.mkdir(parents=True)
    seed.write_bytes(archive.read_bytes())
    restored = run(fresh, "restore")
    assert restored.returncode == 0 and "seeded from" in restored.stdout, restored.stderr
    for rel, data in kept.items():
        path = fresh / ".gpucache" / rel
        assert path.read_bytes() == data and int(path.stat().st_mtime) == OLD, rel
    assert not (fresh / ".gpucache/pycache").exists()
    # once a host: a cache the host has since rebuilt is not overwritten by the seed again
    write(fresh / ".gpucache" / "triton/ABC/quantize_q_kernel.cubin", b"rebuilt", mtime=OLD + 10)
    again = run(fresh, "restore")
    assert again.returncode == 0 and again.stdout == ""
    assert (fresh / ".gpucache/triton/ABC/quantize_q_kernel.cubin").read_bytes() == b"rebuilt"


def test_without_a_seed_restore_does_nothing_and_save_needs_a_cache(tmp_path):
    assert run(tmp_path, "restore").returncode == 0 and not (tmp_path / ".gpucache").exists()
    saved = run(tmp_path, "save")
    assert saved.returncode == 1 and "no .gpucache" in saved.stderr
    assert run(tmp_path, "neither").returncode == 2


def test_an_archive_above_what_a_device_call_returns_is_refused_with_its_largest_parts(tmp_path):
    write(tmp_path / ".gpucache/torch_extensions/snapmla_decode/big.so", os.urandom(17 * 1024 * 1024))
    saved = run(tmp_path, "save")
    assert saved.returncode == 1 and "above the 16 MiB" in saved.stderr and "torch_extensions" in saved.stderr
    assert not (tmp_path / "out/compile-cache.tar.xz").exists()
