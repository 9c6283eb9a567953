"""Every figure the README quotes in "Why use it", its measurement table and the notes under it is in the docs section
it cites, and that section names its data in results/ (a missing file, a section renamed away, a figure that is not
the section's fail). Figures: ratios (1.33x) and measured quantities (µs, ms, TB/s, tok/s, %, nats)."""

import re
from pathlib import Path

import pytest

from helpers import doc_sections

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
SECTIONS = {name: doc_sections(text) for name, text in DOCS.items()}
KERNEL_SECTION = "Decode kernel (H200)"  # the section of the kernel rows, which cite their command


def cited_section(name: str, doc: str = "BENCHMARKS.md") -> str:
    """The section of docs/DOC a README citation names (its heading, or the heading it begins)."""
    found = [text for title, text in SECTIONS[doc].items() if title == name or title.startswith(name)]
    assert found, f'README cites docs/{doc} "{name}", which has no such section'
    return found[0]


def citations(text: str) -> list[tuple[str, str]]:
    """(doc, section name) for each quoted name in `text`: the doc is the last `docs/NAME.md` before the name,
    BENCHMARKS.md where none is."""
    out, doc = [], "BENCHMARKS.md"
    for m in re.finditer(r'docs/([\w-]+\.md)|"([^"]+)"', text):
        if m.group(1):
            doc = m.group(1)
        else:
            out.append((doc, m.group(2)))
    return out


def figures(text: str) -> list[str]:
    """The figures a text quotes: every number of a ratio ("1.33x", "0.76-0.80x", "1.73x / 1.31x") or of a measured
    quantity ("340.3 µs", "3.8-4.05 TB/s", "97.8 / 94.7 %", "0.017-0.018 nats", "498 against 298 tok/s")."""
    out = []
    for low, high in re.findall(r"(\d+\.\d+)(?:-(\d+\.\d+))?x", text):
        out += [low] + ([high] if high else [])
    number = r"\d+(?:\.\d+)?"
    quantity = rf"((?:{number}(?:-{number})?(?: / | against ))*{number}(?:-{number})?) ?(?:µs|ms|TB/s|tok/s|%|nats)\b"
    for run in re.findall(quantity, text):
        out += re.findall(number, run)
    return out


def data_files(section: str) -> tuple[list[str], list[str]]:
    """(the results/ paths a section names that exist, those that do not); a JSON kept as NAME.json.xz counts, a
    glob counts where it matches."""
    found, missing = [], []
    for p in {p.rstrip(".,;:)`'") for p in re.findall(r"results/[\w./*-]+", section)}:
        exists = any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists() or (ROOT / f"{p}.xz").exists()
        (found if exists else missing).append(p)
    return found, missing


def measurement_rows() -> list[list[str]]:
    table = README[README.index("## Measurements"):]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| what")]
    return [[c.strip() for c in row.split("|")[1:-1]] for row in rows]


@pytest.mark.parametrize("row", measurement_rows(), ids=lambda r: r[0][:40])
def test_each_measurement_row_is_in_the_section_it_cites_with_its_data(row):
    what, figures_text, where = row
    cited_names = citations(where) or ([("BENCHMARKS.md", KERNEL_SECTION)]
                                       if "bench_kernels" in where or where == "same" else [])
    if not cited_names:  # capacity: arithmetic on the layout (644 vs 1 152 B), no run
        assert "644" in figures_text and "1 152" in figures_text, row
        return
    names = [name for _, name in cited_names]
    cited = "".join(cited_section(name, doc) for doc, name in cited_names)
    missing = [f for f in figures(figures_text) if f not in cited]
    assert not missing, f"{what}: {missing} not in {names}"
    found, missing = data_files(cited)
    assert found and not missing, f"{what}: {names} names data in results/ that is not there: {missing or 'none'}"


def why_use_it_bullets() -> list[str]:
    part = README[README.index("## Why use it"):README.index("## Set up")]
    return ["- " + b for b in part.split("\n- ")[1:]]


@pytest.mark.parametrize("bullet", why_use_it_bullets(), ids=lambda b: b[4:20])
def test_each_why_use_it_figure_is_in_what_it_cites(bullet):
    bullet_text = re.sub(r"\s+", " ", bullet)
    cited_names = citations(bullet_text)
    names = [name for _, name in cited_names]
    cited = "".join(cited_section(name, doc) for doc, name in cited_names if name != "Measurements")
    if "Measurements" in names:
        cited += README[README.index("## Measurements"):]
    for doc in re.findall(r"docs/(\w+\.md)\)", bullet):  # a whole doc linked without a section
        if doc != "BENCHMARKS.md":
            cited += DOCS[doc]
    assert cited, f"this bullet cites nothing: {bullet[:80]}"
    missing = [f for f in figures(bullet_text) if f not in cited]
    assert not missing, f"{missing} not in what the bullet cites ({names})"


def notes_under_the_table() -> list[str]:
    """The paragraphs between the measurement table and the next section, which quote figures of their own."""
    part = README[README.index("## Measurements"):README.index("## Correct where it is used")]
    after = part[part.rindex("\n| "):].split("\n\n")[1:]
    return [p for p in after if figures(p)]


@pytest.mark.parametrize("note", notes_under_the_table(), ids=lambda n: n[:20])
def test_each_note_under_the_table_is_in_what_it_cites(note):
    text = re.sub(r"\s+", " ", note)
    sentences = re.split(r"(?<=\.) (?=[A-Z])", text)
    for sentence in sentences:
        if not figures(sentence):
            continue
        cited = "".join(cited_section(name, doc) for doc, name in citations(sentence))
        for doc in re.findall(r"docs/([\w-]+\.md)(?! \")", sentence):  # a whole doc named without a section
            cited += DOCS[doc]
        missing = [f for f in figures(sentence) if f not in cited]
        assert cited and not missing, f"{missing} not in what this sentence cites: {sentence[:120]}"
