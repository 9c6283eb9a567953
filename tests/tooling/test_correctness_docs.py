"""docs/DESIGN.md, "Measured on the GPU": the GPU correctness suite's figures are those of the run kept in
results/correctness/ (`bash tools/gpu_host/correctness.sh`'s console output and the mutant's pytest log)."""

import re
from pathlib import Path

from harness.server_log import read_log

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "results" / "correctness" / "h100"


def measured_on_the_gpu() -> str:
    doc = (ROOT / "docs" / "DESIGN.md").read_text()
    start = doc.index("- **Measured on the GPU**")
    return " ".join(doc[start:doc.index("\n- **", start + 1)].split())


def seed_and_summary(log: str) -> tuple[str, ...]:
    """A kept GPU pytest log's SNAPMLA_TEST_SEED and its summary: (seed, passed, skipped, seconds)."""
    seed = re.search(r"SNAPMLA_TEST_SEED=(\d+)", log).group(1)
    return (seed, *re.search(r"^(\d+) passed, (\d+) skipped in ([\d.]+)s", log, re.M).groups())


def test_the_design_docs_gpu_suite_figures_are_the_kept_run():
    text = measured_on_the_gpu()
    console, mutation = read_log(KEPT / "correctness.txt"), read_log(KEPT / "mutation.txt.xz")
    gpu = console.splitlines()[0]
    assert gpu.startswith("NVIDIA H100") and text.startswith("- **Measured on the GPU** (H100,")
    seed, passed, skipped, seconds = seed_and_summary(console)
    assert f"SNAPMLA_TEST_SEED={seed};" in text
    assert f"{passed} passed and {skipped} skipped" in text and f"in {round(float(seconds))} s," in text
    assert f"SKIPPED [{skipped}] tests/product/test_serving_safety.py" in console  # the skips the text explains
    failed, mutant_passed = re.search(r"^(\d+) failed, (\d+) passed", mutation, re.M).groups()
    assert f"({failed} failed, {mutant_passed} passed)" in text
    cases = re.findall(r"^FAILED .*\[(\d+)-\d+-True-\d+-decode-cuda\]$", mutation, re.M)
    assert sorted(cases, key=int) == ["16", "128"] and "one-split sm_90a decode cases fail at 16 and 128 heads" in text
    for tool in ("memcheck triton", "memcheck cuda", "racecheck cuda"):
        assert re.search(rf"^{tool} rc=0 .*(?: 0 errors| 0 hazards)", console, re.M), tool
    assert "memcheck 0 errors (Triton and sm_90a), racecheck 0 hazards" in text
    assert console.rstrip().endswith("all correctness checks passed")


def test_the_serving_safety_run_on_its_own_is_the_kept_one():
    text = measured_on_the_gpu()
    log = read_log(KEPT / "serving_safety.txt")
    assert log.startswith("NVIDIA H100")
    seed, passed, skipped, seconds = seed_and_summary(log)
    quoted = (f"SNAPMLA_TEST_SEED={seed}; `results/correctness/h100/serving_safety.txt`): {passed} passed and "
              f"{skipped} skipped in {round(float(seconds))} s.")
    assert quoted in text, quoted


def mutant_outcomes(folder: str) -> dict[str, tuple[str, str]]:
    """A kept cuda_mutants.sh run's outcomes: {mutant: (outcome, first failing test or pytest's summary)}."""
    from tools.kernel_dev.cuda_mutants import read_outcomes

    return read_outcomes(KEPT / "cuda_mutants" / folder / "outcomes.tsv")


def test_the_cuda_mutation_run_is_the_kept_one():
    """Every mutant tools/kernel_dev/cuda_mutants.py defines is caught in the kept run, with the seed, the flags and the
    unmutated copy's summary the text quotes; a mutant added without a run fails here."""
    from tools.kernel_dev.cuda_mutants import BY_NAME

    text = measured_on_the_gpu()
    run = mutant_outcomes("four_at_a_time")
    assert set(run) == {"unmutated", *BY_NAME}
    assert {name for name, (outcome, _) in run.items() if outcome == "caught"} == set(BY_NAME)
    assert f"each of the {len(BY_NAME)} bugs" in text and f"All {len(BY_NAME)} are caught in one run" in text
    seconds = [int(re.search(r"\((\d+) s\)$", detail).group(1)) for name, (_, detail) in run.items()
               if name != "unmutated"]
    assert f"first failing test in {min(seconds)}-{max(seconds)} s" in text
    assert run["wide_keyless_row_scale"][1].startswith(
        "tests/product/test_serving_safety.py::test_rows_without_a_visible_key_are_zero_with_lse_minus_inf[16-cuda-1]")
    assert run["narrow_keyless_row_scale"][1].startswith(
        "tests/product/test_serving_safety.py::test_rows_without_a_visible_key_are_zero_with_lse_minus_inf[4-cuda-1]")
    assert run["binding_bt_entries_unchecked"][1].startswith(
        "tests/product/test_gpu_kernels.py::test_cuda_decode_refuses_a_block_table_bound_past_the_tables_storage")
    outcome, summary = run["unmutated"]
    passed, skipped, seconds = re.match(r"(\d+) passed, (\d+) skipped, \d+ deselected in ([\d.]+)s", summary).groups()
    assert outcome == "survived" and f"({passed} passed and {skipped} skipped in {round(float(seconds))} s)" in text
    folder = KEPT / "cuda_mutants" / "four_at_a_time"
    assert (folder / "seed.txt").read_text().strip() + ";" in text and "`JOBS=4 MUTANT_TIMEOUT=240" in text
    assert (folder / "gpu.txt").read_text().startswith("NVIDIA H100")


def test_the_developing_docs_threads_figures_are_the_kept_run():
    """docs/DEVELOPING.md, "Threads": the four processes with torch's default threads ran into their limit, each
    stopped in the spec on the CPU; with nproc / 4 threads each passed, as one process alone did."""
    doc = " ".join((ROOT / "docs" / "DEVELOPING.md").read_text().split())
    para = doc[doc.index("**Threads.**"):doc.index("## CI")]
    run = KEPT / "threads"
    gpu, cores = (run / "gpu.txt").read_text().splitlines()
    assert gpu.startswith("NVIDIA H100") and f"{cores}-core H100 host" in para
    summary = dict(line.split(": ", 1) for line in (run / "summary.txt").read_text().splitlines())
    limit = [int(s) for s in re.findall(r"rc=124 after (\d+) s", summary["four_default"])]
    assert len(limit) == 4 and f"ran past {min(limit) - 1} s with torch's default threads" in para
    for i in range(1, 5):
        log = read_log(run / f"four_default.{i}.log.xz")
        assert "Timeout" in log and re.search(r"numerics\.py\", line \d+ in snapmla_decode_reference\n", log)
    passed = [int(s) for s in re.findall(r"rc=0 after (\d+) s", summary["four_omp4"])]
    assert len(passed) == 4 and f"passed in {min(passed)}-{max(passed)} s each with 4 threads" in para
    alone = re.fullmatch(r"rc=0 after (\d+) s ", summary["solo"]).group(1)
    assert f"one process alone in {alone} s" in para
    monitor = read_log(run / "four_default.monitor.xz")
    busy = [int(u) for u in re.findall(r"^(\d+) %, \d+ MiB$", monitor, re.M)]  # a sample every 10 s
    idle = len(busy) - max(i for i, u in enumerate(busy) if u > 0) - 1
    assert idle >= 6 and f"with the GPU idle for the last {idle * 10 - 10}-{idle * 10} s" in para
