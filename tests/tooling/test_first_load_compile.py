"""docs/DEPLOY.md's "Start-up time" on the compile a fresh host runs after ready: the stall it quotes is in the saved
server log (no batch between the two stamps), FlashInfer's sampling build spans it in the saved cache listing (lock
file to `sampling.so`), and every process sample inside it has the GPU idle and a stage of nvcc busiest."""

import lzma
import re
from pathlib import Path

from harness.server_log import BATCH_LINE, read_log
from helpers import clock_seconds as seconds
from helpers import doc_sections

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results/serve/fresh_host_first_load_h200"
COMPILER_STAGES = {"cicc", "ptxas", "cc1plus", "cudafe++", "nvcc", "fatbinary", "nvlink"}


def section() -> str:
    return " ".join(doc_sections((ROOT / "docs/DEPLOY.md").read_text())["Start-up time"].split())


def batch_stamps() -> list[str]:
    """The time of day of each Prefill / Decode batch line of the server log's excerpt."""
    lines = read_log(RUN / "server_excerpt.log.xz").splitlines()
    return [m.group(1).split()[1] for m in map(BATCH_LINE.match, lines) if m]


def cache_times() -> dict[str, str]:
    """file name -> the time it was written (the listing: 'HH:MM:SS.frac size path' per file)."""
    out = {}
    for line in lzma.open(RUN / "cache_files.txt.xz", "rt"):
        stamp, _, path = line.split(" ", 2)
        out.setdefault(path.strip().rsplit("/", 1)[-1], stamp)
    return out


def samples() -> list[tuple[str, str, str]]:
    """(time, the busiest process's program, GPU utilization) per sample of the saved `ps` / nvidia-smi loop."""
    text = lzma.open(RUN / "ps_samples.txt.xz", "rt").read()
    parts = re.split(r"^(\d\d:\d\d:\d\d)$", text, flags=re.M)[1:]
    out = []
    for stamp, body in zip(parts[::2], parts[1::2]):
        lines = body.strip().splitlines()
        program = lines[1].split(None, 3)[3].split()[0].rsplit("/", 1)[-1]
        out.append((stamp, program, lines[-1].split(",")[0]))
    return out


def test_the_stall_the_doc_quotes_is_the_sampling_build_with_the_gpu_idle():
    text = section()
    start, end = re.search(r"logged no batch from (\d\d:\d\d:\d\d) to (\d\d:\d\d:\d\d)", text).groups()
    stamps = batch_stamps()
    assert start in stamps and end in stamps
    assert not [s for s in stamps if start < s < end], "a batch inside the quoted gap"
    times = cache_times()
    lock, built = times["sampling.lock"], times["sampling.so"]
    assert f"from its lock file ({lock[:8]}) to `sampling.so` ({built[:8]}), {seconds(built) - seconds(lock):.0f} s" \
        in text
    assert start <= lock[:8] and built[:8] <= end
    inside = [s for s in samples() if lock[:8] < s[0] < built[:8]]
    assert len(inside) >= 15  # every 4 s over the gap
    for stamp, program, gpu in inside:
        assert program in COMPILER_STAGES and gpu == "0 %", (stamp, program, gpu)
    named = re.search(r"nvcc's stages \(([^)]*)\)", text).group(1).split(", ")
    assert set(named) == {program for _, program, _ in inside}
    # docs/BENCHMARKS.md's soak section quotes the same gap
    soak = " ".join(doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())["Soak with bad ids"].split())
    assert f"at the same place (no batch for {seconds(end) - seconds(start):.0f} s)" in soak
    # and BENCHMARKS' "By question" start-up row quotes the build's length
    row = next(ln for ln in (ROOT / "docs/BENCHMARKS.md").read_text().splitlines()
               if ln.startswith("| How long does a server take to start? |"))
    assert f"waits {seconds(built) - seconds(lock):.0f} s for FlashInfer's sampling build" in row


def test_the_soak_sections_start_up_figures_are_the_fresh_hosts_capture():
    """docs/BENCHMARKS.md's soak section: the decode-graph capture of the fresh host's server (batch sizes, their
    largest, seconds) as its log excerpt has it."""
    log = read_log(RUN / "server_excerpt.log.xz")
    sizes = re.search(r"Capture target decode CUDA graph begin\. .*bs=\[([\d, ]+)\]", log).group(1).split(", ")
    took = float(re.search(r"Capture target decode CUDA graph end\. elapsed=([\d.]+) s", log).group(1))
    soak = " ".join(doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())["Soak with bad ids"].split())
    assert f"decode graphs for {len(sizes)} batch sizes up to {sizes[-1]} captured in {took:.0f} s" in soak
