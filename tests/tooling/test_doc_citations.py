"""Every citation of a docs section -- `docs/NAME.md, "Section"` in the README, the docs, results/README.md and the
code -- names a heading or a bold lead-in (`**Section...**`) that exists in that doc: sections can move and be
renamed, but nothing a doc, a test or the code cites may disappear."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r'docs/([\w-]+\.md)[,;:]?\s*((?:"[^"]+"(?:\s*(?:and|,|or)\s*)?)+)')


def citing_files() -> list[Path]:
    texts = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    code = [p for d in ("sglang_snapmla", "benchmarks", "harness", "tools", "study", "kernels", "examples")
            for p in sorted((ROOT / d).rglob("*.py"))]
    return texts + code


def anchors(doc: str) -> list[str]:
    """A doc's headings and the bold phrases that open a paragraph or a list item."""
    heads = [m.group(1).strip() for m in re.finditer(r"^#{1,4} (.+)$", doc, re.M)]
    bold = [m.group(1).strip() for m in re.finditer(r"(?:^|\n)\s*(?:- )?\*\*([^*]+)\*\*", doc)]
    return heads + bold


def test_every_cited_docs_section_exists():
    docs = {str(p.relative_to(ROOT / "docs")): anchors(p.read_text()) for p in (ROOT / "docs").rglob("*.md")}
    missing, seen = [], 0
    for path in citing_files():
        text = re.sub(r"\s+", " ", re.sub(r"^\s*#\s?", "", path.read_text(), flags=re.M))
        for m in CITATION.finditer(text):
            for name in re.findall(r'"([^"]+)"', m.group(2)):
                seen += 1
                targets = docs.get(m.group(1))
                if targets is None or not any(a == name or a.startswith(name) for a in targets):
                    missing.append(f"{path.relative_to(ROOT)}: docs/{m.group(1)} \"{name}\"")
    assert seen > 50, seen
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)
