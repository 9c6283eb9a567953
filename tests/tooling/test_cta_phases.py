"""tools/kernel_dev/phase_stamps.py and benchmarks/gpu/cta_phases.py without a GPU: the stamps land in today's
64-row kernel at their points and nowhere else, a kernel that lost a point is refused, and the phase arithmetic
(waves per SM by start time, gaps, clock64 durations at the stamps' SM clock) on stamps made up here."""

import numpy as np
import pytest

from benchmarks.gpu import cta_phases
from sglang_snapmla.cuda_ext import SOURCE_DIR
from tools.kernel_dev import phase_stamps


def test_the_stamped_copy_differs_only_by_the_stamps(tmp_path):
    dest = phase_stamps.write(SOURCE_DIR, tmp_path)
    for name in (phase_stamps.KERNEL, phase_stamps.BINDING):
        source, stamped = (SOURCE_DIR / name).read_text(), (dest / name).read_text()
        added = [line for line in stamped.splitlines() if line not in source.splitlines()]
        # every line of the source is still there, in order
        it = iter(stamped.splitlines())
        assert all(line in it for line in source.splitlines())
        if name == phase_stamps.KERNEL:
            calls = [line.strip() for line in added if "phase_stamp(" in line and "// phase stamp:" in line]
            assert calls == [f"if ({thread}) phase_stamp({i});  // phase stamp: {point}"
                             for i, (point, _, thread, _) in enumerate(phase_stamps.POINTS)]
            wide = stamped[stamped.index(phase_stamps.WIDE_BEGIN):stamped.index(phase_stamps.WIDE_END)]
            assert wide.count("phase_stamp(") == len(phase_stamps.POINTS)  # the narrow kernel has none
        else:
            assert any('m.def("phase_stamps"' in line for line in added)
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in SOURCE_DIR.iterdir() if p.is_file())


def test_the_stamps_follow_their_points():
    stamped = phase_stamps.stamp_kernel((SOURCE_DIR / phase_stamps.KERNEL).read_text())
    lines = stamped.splitlines()
    for i, (point, _, _, anchor) in enumerate(phase_stamps.POINTS):
        at = next(k for k, line in enumerate(lines) if f"phase_stamp({i});" in line)
        if anchor == "#endif\n":
            assert lines[at + 1] == "#endif"
        else:
            assert lines[at - 1] == anchor.rstrip("\n").split("\n")[-1], point


def test_a_kernel_without_a_point_is_refused():
    source = (SOURCE_DIR / phase_stamps.KERNEL).read_text()
    with pytest.raises(SystemExit, match="'softmax' occurs 0 times in the 64-row kernel"):
        phase_stamps.stamp_kernel(source.replace("softmax_page(cur, last - 1, [] {});", "softmax_last(cur);"))
    with pytest.raises(SystemExit, match="the module definition"):
        phase_stamps.stamp_binding("no module here")


def _cta(sm, start_ns, durations_us, ghz=1.5):
    """Stamp row of a CTA on `sm` starting at start_ns whose successive points are durations_us apart."""
    ns = np.concatenate([[0.0], np.cumsum(durations_us) * 1e3]) + start_ns + 1e9  # %globaltimer is never 0
    clk = 10_000 * (sm + 1) + (ns - 1e9) * ghz  # each SM's own clock, running across its CTAs
    return np.concatenate([ns, clk, [sm]]).astype(np.int64)


def test_phases_per_wave_and_gap():
    # points: start barriers released q page0 qk0 softmax pv end
    first = [0.5, 2.0, 0.5, 1.0, 0.8, 14.4, 1.0, 2.0]  # 22.2 µs
    second = [0.5, 0.0, 0.4, 1.0, 0.8, 14.4, 1.0, 2.0]  # no PDL wait
    rows = np.stack([
        _cta(1, 30_000, second),  # listed before its SM's first CTA: waves come from start times, not order
        _cta(0, 0, first),
        _cta(1, 100, first),
        _cta(0, 23_000, second),
    ])
    p = cta_phases.phases(rows, np.array([10, 10, 10, 10]))
    assert p["ghz"] == pytest.approx(1.5)
    assert list(p["wave"]) == [1, 0, 0, 1]
    assert p["gap"][3] == pytest.approx(23.0 - 22.2, abs=1e-6) and p["gap"][0] == pytest.approx(30.0 - 22.3, abs=1e-6)
    assert np.isnan(p["gap"][1]) and np.isnan(p["gap"][2])
    assert p["pdl_wait"][1] == pytest.approx(2.0) and p["pdl_wait"][0] == pytest.approx(0.0)
    assert p["page0"][1] == pytest.approx(0.5 + 1.0)  # from the release, not from Q's arrival
    assert p["per_page"][1] == pytest.approx(14.4 / 9)
    assert p["total"][1] == pytest.approx(22.2)
    waves = cta_phases.summarize(p)
    assert [(w["wave"], w["ctas"]) for w in waves] == [(0, 2), (1, 2)]
    assert waves[0]["start"] == pytest.approx(0.05) and waves[1]["gap"] == pytest.approx((0.8 + 7.7) / 2, abs=1e-6)
    assert waves[0]["gap"] is None


def test_a_cta_that_missed_a_point_is_refused():
    row = _cta(0, 0, [0.5] * 8)
    row[cta_phases.POINT_NAMES.index("softmax")] = 0
    with pytest.raises(ValueError, match=r"without a stamp at \['softmax'\]"):
        cta_phases.phases(row[None], np.array([10]))


def test_the_kernel_doc_quotes_the_kept_run():
    """docs/KERNEL.md's per-phase table is what `cta_phases --redraw` prints of the kept H100 run, and the figures
    its text draws from it (phase ranges at s_k 640, the back-to-back bound at b128, the stamps' cost) are that
    run's."""
    from pathlib import Path

    from harness.results import read_json
    from helpers import doc_sections

    root = Path(__file__).resolve().parents[2]
    kept = root / "results/bench/cta_phases_h100"
    saved = read_json(kept / "cta_phases.json")
    section = doc_sections((root / "docs/KERNEL.md").read_text())["What limits it"]
    text = " ".join(section.split())
    for line in cta_phases.table(saved["results"]).splitlines():
        assert "  " + line + "\n" in section, line
    short = [(r, w) for r in saved["results"] if r["s_k"] == 640 for w in r["waves"]]

    def span(values, fmt="{:.1f}"):
        lo, hi = fmt.format(min(values)), fmt.format(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    pre = [w["entry"] + w["pdl_wait"] + w["page0"] for _, w in short]
    post = [w["pv_tail"] + w["epilogue"] for _, w in short]
    out = [a + b for a, b in zip(pre, post)]
    assert (f"At s_k 640 a CTA takes {span([w['total'] for _, w in short])} µs: {span(pre)} from its start until its "
            f"first page has landed") in text
    assert f"{span([w['loop'] for _, w in short])} in its pages after the first one's QK" in text
    assert f"({span([w['per_page'] for _, w in short], '{:.2f}')} µs a page" in text
    assert f"at the {span([r['ghz'] for r, _ in short], '{:.2f}')} GHz the stamps give" in text
    assert f"and {span(post)} after its last softmax" in text
    shares = [o / w["total"] * 100 for o, (_, w) in zip(out, short)]
    assert f"{span(out)} µs, {span(shares, '{:.0f}')} %, outside the page loop" in text
    long = [w for r in saved["results"] if r["s_k"] == 4096 for w in r["waves"]]
    long_out = [w["entry"] + w["pdl_wait"] + w["page0"] + w["pv_tail"] + w["epilogue"] for w in long]
    assert (f"At s_k 4 096 the same {span(long_out)} µs are "
            f"{span([o / w['total'] * 100 for o, w in zip(long_out, long)], '{:.0f}')} % of a CTA") in text
    b128 = next(r for r in saved["results"] if (r["batch"], r["s_k"]) == (128, 640))
    w0, w1 = b128["waves"]
    ideal = (w0["entry"] + w0["pdl_wait"] + w0["page0"] + w0["qk0"] + w0["loop"] + w1["qk0"] + w1["loop"]
             + w1["pv_tail"] + w1["epilogue"])
    chain = b128["chain_us"] - (b128["kernel_us"] - ideal)
    assert (f"{ideal:.1f} µs against the {b128['kernel_us']:.1f} µs of CTAs here, {chain:.1f} µs for the chain "
            f"against {b128['chain_us']:.1f}") in text
    other = read_json(root / "results/bench/kernels_h100_persistent_units_bench.json")["results"]
    [bf16] = [r["us"] for r in other if (r["kernel"], r["h"], r["b"], r["sk"], r["s_q"]) == ("flashmla_bf16", 128, 128,
                                                                                               640, 1)]
    assert f"FlashMLA BF16 took {bf16:.1f} µs" in text and f"{bf16 / chain:.2f}x that" in text
    assert f"(1.15x would be {bf16 / 1.15:.1f} µs)" in text
    b64 = next(r for r in saved["results"] if (r["batch"], r["s_k"]) == (64, 640))
    assert f"the {b64['chain_us'] - b64['kernel_us']:.1f} µs from the chain's start to the first CTA's" in text
    cost = read_json(kept / "stamps_cost.json")

    def rounds(shape, name):
        return [cost[k][shape] for k in (name, f"{name}#2")]

    assert (f"h128 b64 s_k 640 {span(rounds('h128x64x640', 'stamps'))} against "
            f"{span(rounds('h128x64x640', 'main'))} µs, b128 s_k 640 {span(rounds('h128x128x640', 'stamps'))} against "
            f"{span(rounds('h128x128x640', 'main'))}") in text
    costs = [min(rounds(s, "stamps")) / max(rounds(s, "main")) - 1 for s in ("h128x64x640", "h128x128x640")]
    assert f"The stamps cost {span([c * 100 for c in costs], '{:.0f}')} %" in text
    for shape in ("h128x256x1280", "h128x128x4096"):  # the rounds overlap
        assert min(rounds(shape, "stamps")) <= max(rounds(shape, "main")), shape
