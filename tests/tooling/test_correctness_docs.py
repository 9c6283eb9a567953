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


def test_the_cuda_mutation_runs_are_the_kept_ones():
    """Every mutant tools/kernel_dev/cuda_mutants.py defines is caught in one of the two kept runs, with the counts,
    seeds and the unmutated copy's summary the text quotes; a mutant added without a run fails here."""
    from tools.kernel_dev.cuda_mutants import BY_NAME

    text = measured_on_the_gpu()
    sweep, rest = mutant_outcomes("sweep"), mutant_outcomes("keyless_and_bound")
    caught = {name for runs in (sweep, rest) for name, (outcome, _) in runs.items() if outcome == "caught"}
    assert caught == set(BY_NAME) and f"each of the {len(BY_NAME)} bugs" in text and f"All {len(BY_NAME)} are" in text
    in_sweep = sum(outcome == "caught" for outcome, _ in sweep.values())
    assert set(sweep) == {"unmutated", *BY_NAME} and f"{in_sweep} of them in one run of all {len(BY_NAME)}" in text
    assert {name for name, (outcome, _) in sweep.items() if outcome == "timed out"} == {
        "unmutated", "wide_keyless_row_scale", "narrow_keyless_row_scale"}
    survived = re.match(r"(\d+) passed", sweep["binding_bt_entries_unchecked"][1]).group(1)
    assert sweep["binding_bt_entries_unchecked"][0] == "survived" and f"selected ({survived} passed)" in text
    assert set(rest) == {"unmutated"} | set(BY_NAME) - {n for n, (o, _) in sweep.items() if o == "caught"}
    assert rest["wide_keyless_row_scale"][1].startswith(
        "tests/product/test_serving_safety.py::test_rows_without_a_visible_key_are_zero_with_lse_minus_inf[16-cuda-1]")
    assert rest["binding_bt_entries_unchecked"][1].startswith(
        "tests/product/test_gpu_kernels.py::test_cuda_decode_refuses_a_block_table_bound_past_the_tables_storage")
    outcome, summary = rest["unmutated"]
    passed, skipped, seconds = re.match(r"(\d+) passed, (\d+) skipped, \d+ deselected in ([\d.]+)s", summary).groups()
    assert outcome == "survived" and f"({passed} passed and {skipped} skipped in {round(float(seconds))} s)" in text
    for folder in ("sweep", "keyless_and_bound"):
        assert (KEPT / "cuda_mutants" / folder / "seed.txt").read_text().strip() + ";" in text
        assert (KEPT / "cuda_mutants" / folder / "gpu.txt").read_text().startswith("NVIDIA H100")


def test_the_developing_docs_stalls_are_the_kept_runs():
    """docs/DEVELOPING.md's `cuda_mutants.sh` row: the pytest processes that ran past their limit in the kept runs,
    each stopped after the tests that precede test_gpu_graph_protocol's batch-140 cases (41 or 42 of test_gpu_kernels,
    then the 3 batch-2 cases and, in the later run, the batch-140 decode case)."""
    row = next(line for line in (ROOT / "docs" / "DEVELOPING.md").read_text().splitlines()
               if line.startswith("| `cuda_mutants.sh` |"))
    runs = {folder: mutant_outcomes(folder) for folder in ("sweep", "keyless_and_bound", "two_at_a_time")}
    stalled = [(folder, name, detail.split()[0]) for folder, outcomes in runs.items()
               for name, (outcome, detail) in outcomes.items() if outcome == "timed out"]
    assert len(stalled) == 4 and "in three H100 runs with two or four at a time" in row
    assert "four pytest processes stopped advancing" in row
    assert {dots for _, _, dots in stalled} == {"." * 44, "." * 46}
    assert sum(name == "unmutated" for _, name, _ in stalled) == 2 and "the unmutated copy's in two of the runs" in row
