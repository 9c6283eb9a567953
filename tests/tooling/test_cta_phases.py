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
