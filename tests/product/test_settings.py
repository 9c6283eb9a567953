"""The environment switches (`sglang_snapmla.settings`) are the ones the docs list: every SNAPMLA_ variable the package
reads is a settings constant, read in settings.py only, and documented -- in docs/DEPLOY.md's table, or the kernel
development one in docs/DEVELOPING.md -- and every variable the table lists is one the code reads."""

import re
from pathlib import Path

import pytest

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


# each switch's reader: unset -> the default the DEPLOY table names, then what values it takes
READERS = {
    settings.DECODE_IMPL_ENV: (settings.requested_decode_impl, "auto", [("cuda", "cuda"), ("triton", "triton")]),
    settings.PDL_ENV: (settings.pdl_allowed, True, [("0", False), ("1", True), ("", True)]),
    settings.Q_IN_DECODE_ENV: (settings.q_in_decode_requested, False, [("1", True), ("0", False), ("", False)]),
    settings.CHECK_INDICES_ENV: (settings.index_checks_enabled, False, [("1", True), ("0", False), ("", False)]),
    settings.EXTEND_ROUTE_ENV: (settings.requested_extend_route, "auto", [("mha", "mha"), ("absorbed", "absorbed")]),
    settings.HICACHE_COPIES_ENV: (settings.requested_hicache_copies, "kernels", [("torch", "torch")]),
    settings.FLASHMLA_SCHEDULE_ENV: (settings.flashmla_schedule_computed, False, [("1", True), ("0", False)]),
    settings.DUMMY_WEIGHTS_ENV: (settings.requested_dummy_weights, "sglang", [("deployment", "deployment")]),
    settings.CUDA_SOURCE_DIR_ENV: (settings.cuda_source_dir, None, [("", None), ("/src/kernels", "/src/kernels")]),
}


def test_each_switch_reads_as_the_docs_say(monkeypatch):
    """Unset, each reader gives the default the docs name (the table's "(default" value, or the opt-in's off state);
    set, the value it was given, set empty the default. A switch read at its use sees a value set
    after the import; Triton's own TRITON_INTERPRET is read the same way."""
    assert set(READERS) == switches()
    rows = {r["variable"].strip("`"): r["effect"] for r in
            doc_tables(doc_sections((ROOT / "docs" / "DEPLOY.md").read_text())["Environment variables"])[0]}
    for var, (reader, default, values) in READERS.items():
        monkeypatch.delenv(var, raising=False)
        assert reader() == default, var
        if isinstance(default, str):
            effect = rows[var]
            assert effect.startswith(f"`{default}` (default") or f"Unset or `{default}`:" in effect, (var, effect[:60])
        for value, read in values:
            monkeypatch.setenv(var, value)
            assert reader() == read, (var, value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not settings.interpreter_mode()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert settings.interpreter_mode()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not settings.interpreter_mode()


# values a serving engineer might type for a switch that takes others
TYPOS = ["true", "yes", "on", "off", "false", "TRITON", "Cuda", " 1", "kernel", "real", "2"]


def test_every_switch_refuses_a_value_it_does_not_take(monkeypatch):
    """A value outside a switch's documented ones is an error naming the switch, the value and the values it takes:
    read as the default, `SNAPMLA_CHECK_INDICES=true` would serve with no index checks and `SNAPMLA_PDL=off` with
    PDL on, silently. Only the development switch SNAPMLA_CUDA_SOURCE_DIR takes any value (a folder)."""
    assert set(settings.VALUES) == switches() - {settings.CUDA_SOURCE_DIR_ENV}
    for var, (reader, _, _) in READERS.items():
        if var == settings.CUDA_SOURCE_DIR_ENV:
            continue
        for typo in (t for t in TYPOS if t not in settings.VALUES[var]):
            monkeypatch.setenv(var, typo)
            with pytest.raises(ValueError) as e:
                reader()
            assert str(e.value).startswith(f"{var}={typo!r}: set it to ") and all(
                repr(v) in str(e.value) for v in settings.VALUES[var]), str(e.value)
            with pytest.raises(ValueError, match=var):
                settings.check_switches()
        monkeypatch.delenv(var)
    settings.check_switches()
