"""benchmarks/gpu/eager_layer.py on the CPU: the committed H200 run redraws into the table docs/DESIGN.md quotes."""

from pathlib import Path

import pytest

from benchmarks.gpu import eager_layer
from helpers import ink_share

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, lines, columns", [("eager_layer_h200.json", 10, 7),
                                                 ("eager_layer_h200_three_backends.json", 6, 9)])
def test_saved_run_reports_what_the_docs_quote(tmp_path, capsys, name, lines, columns):
    """Both committed runs (two backends; three, SGLang's FP8 path added) redraw into the tables the docs quote,
    header included."""
    saved = ROOT / "results" / "bench" / name
    copy = tmp_path / saved.name
    copy.write_bytes(saved.read_bytes())
    assert eager_layer.main(["--redraw", str(copy)]) == 0
    assert ink_share(copy.with_suffix(".png")) > 0.05
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith(("| 16 ", "| 128 "))]
    assert len(rows) == lines and all(r.count("|") == columns + 1 for r in rows)
    docs = (ROOT / "docs" / "DESIGN.md").read_text()
    for line in [out[0], *rows]:
        assert line in docs, line
