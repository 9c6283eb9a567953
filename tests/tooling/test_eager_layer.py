"""benchmarks/gpu/eager_layer.py on the CPU: the committed H200 run redraws into the table docs/BENCHMARKS.md quotes."""

from pathlib import Path

from benchmarks.gpu import eager_layer

ROOT = Path(__file__).resolve().parents[2]


def test_saved_run_reports_what_the_docs_quote(tmp_path, capsys):
    saved = ROOT / "results" / "bench" / "eager_layer_h200.json"
    copy = tmp_path / saved.name
    copy.write_bytes(saved.read_bytes())
    assert eager_layer.main(["--redraw", str(copy)]) == 0
    assert copy.with_suffix(".png").stat().st_size > 10_000
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 16 ", "| 128 "))]
    assert len(rows) == 10
    docs = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    for line in rows:
        assert line in docs, line
