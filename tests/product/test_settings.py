"""The environment switches (`sglang_snapmla.settings`) are the ones the docs list: every SNAPMLA_ variable the package
reads is a settings constant, read in settings.py only, and documented -- in docs/DEPLOY.md's table, or the kernel
development one in docs/DEVELOPING.md -- and every variable the table lists is one the code reads."""

import re
from pathlib import Path

from helpers import doc_sections, doc_tables
from sglang_snapmla import settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sglang_snapmla"


def switches() -> set[str]:
    return {v for k, v in vars(settings).items() if k.endswith("_ENV") and v.startswith("SNAPMLA_")}


def test_every_snapmla_variable_in_the_package_is_a_setting():
    named = {m for p in PACKAGE.glob("*.py") for m in re.findall(r"\bSNAPMLA_[A-Z0-9_]+\b", p.read_text())}
    named -= {n for n in named if n.endswith("_ENV")}  # the constants' own names
    assert named == switches(), named ^ switches()


def test_only_settings_reads_the_environment_for_a_snapmla_switch():
    for p in PACKAGE.glob("*.py"):
        if p.name == "settings.py":
            continue
        reads = re.findall(r"os\.environ(?:\.get)?[\[(]\s*([A-Z_]+)", p.read_text())
        assert not [r for r in reads if r.endswith("_ENV") and getattr(settings, r, None) in switches()], p.name


def test_every_switch_is_documented_and_every_documented_one_exists():
    table = doc_tables(doc_sections((ROOT / "docs" / "DEPLOY.md").read_text())["Environment variables"])[0]
    documented = {r["variable"].strip("`") for r in table}
    development = (ROOT / "docs" / "DEVELOPING.md").read_text()
    undocumented = {s for s in switches() if s not in documented and f"`{s}=" not in development}
    assert not undocumented, undocumented
    stale = {v for v in documented if v.startswith("SNAPMLA_") and v not in switches()}
    assert not stale, stale
