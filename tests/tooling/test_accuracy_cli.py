"""The accuracy report runs end to end and writes a table, JSON and a plot."""

import json

import pytest

from study import accuracy
from helpers import ink_share


def test_accuracy_report_small(tmp_path, capsys):
    accuracy.main(["--layers", "2", "--seeds", "2", "--batch", "2", "--heads", "4", "--seq-len", "256",
                   "--out", str(tmp_path), "--no-progress"])
    table = capsys.readouterr().out
    for name in ("SnapMLA", "A", "B", "C", "D", "BF16"):
        assert f"| {name} |" in table
    data = json.loads((tmp_path / "accuracy.json").read_text())
    assert set(data["summary"]) == set(accuracy.CONFIGS)
    assert len(data["per_layer"]["SnapMLA"]["rel_l2"]) == 2
    assert data["summary"]["BF16"]["rel_l2"] < data["summary"]["SnapMLA"]["rel_l2"] < 0.1
    assert ink_share(tmp_path / "accuracy.png") > 0.05


def test_the_study_names_its_extra_when_a_dependency_is_missing(monkeypatch):
    import sys

    from study import accuracy

    monkeypatch.setitem(sys.modules, "tqdm", None)  # an import of tqdm now fails, as where it is not installed
    with pytest.raises(ImportError, match=r"pip install 'sglang-snapmla\[accuracy\]'"):
        accuracy._study_dependency("tqdm")
