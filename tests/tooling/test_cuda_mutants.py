"""tools/kernel_dev/cuda_mutants.py: every mutant of the sm_90a decode still applies to kernels/cuda as it is (a
kernel change that moves a mutated line fails here, not silently on the GPU host), changes only its own file, and
the GPU run's outcomes are summarized as they were recorded."""

import json

import pytest

from sglang_snapmla.cuda_sources import SOURCE_DIR
from tools.kernel_dev import cuda_mutants as cm


def test_every_mutant_applies_to_the_sources_as_they_are(tmp_path):
    written = cm.write(tmp_path)
    assert [p.name for p in written] == [m.name for m in cm.MUTANTS]
    for mutant, path in zip(cm.MUTANTS, written):
        changed = [f.name for f in sorted(SOURCE_DIR.iterdir()) if f.is_file()
                   and (path / f.name).read_bytes() != f.read_bytes()]
        assert changed == [mutant.file], mutant.name
        text = (path / mutant.file).read_text()
        for old, new, count in mutant.edits:
            assert text.count(new) >= count and old not in text, (mutant.name, old)


def test_a_mutant_whose_text_moved_is_refused_by_name():
    mutant = cm.MUTANTS[0]
    moved = cm.Mutant(mutant.name, mutant.what, ((mutant.edits[0][0], "x", 2),))
    source = (SOURCE_DIR / mutant.file).read_text()
    with pytest.raises(ValueError, match=f"{mutant.name}: .* is at 1 places in {mutant.file}, expected 2"):
        cm.mutate(source, moved)
    with pytest.raises(ValueError, match="is at 0 places"):
        cm.mutate("int main() {}", mutant)


def test_the_summary_keeps_each_outcome_and_counts_them(tmp_path, capsys):
    tsv = tmp_path / "outcomes.tsv"
    tsv.write_text("unmutated\tsurvived\t5 passed in 1.0s (2 s)\n"
                   "wide_lse_base2\tcaught\ttests/x.py::test_y (4 s)\n"
                   "wide_lse_layout\ttimed out\t.... (180 s)\n")
    rows = cm.summarize(tsv, tmp_path / "summary")
    assert [r["outcome"] for r in rows] == ["survived", "caught", "timed out"]
    assert rows[1]["what"] == cm.BY_NAME["wide_lse_base2"].what and rows[0]["what"] == ""
    assert json.loads((tmp_path / "summary.json").read_text()) == rows
    assert capsys.readouterr().out.rstrip().endswith("1 caught, 1 survived, 1 timed out")
