"""docs/BENCHMARKS.md, "MTP against SGLang's FP8 cache (H100, 40 of the 61 layers, simulated acceptance)": every
cell of its table and the figures its text draws from them are the kept runs (results/serve/v3_fp8_tp8_l40_h100_mtp_fp8
and its _repeat, _third and _8k folders): the saved JSON for the client's side, the server-log excerpts
(`benchmarks.server_log_stats`) for the decode step and the prefill batches."""

import functools
from pathlib import Path

import pytest

from benchmarks.server_log_stats import log_stats
from harness.results import read_json
from harness.server import MTP_SIMULATED_ACCEPT
from harness.server_log import read_log
from helpers import doc_sections, doc_tables, quoted_range, shows

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "results/serve"
# the table's run column -> its folder, in the order the commands ran on the host
FOLDERS = {"fresh host": SERVE / "v3_fp8_tp8_l40_h100_mtp_fp8",
           "snapmla first": SERVE / "v3_fp8_tp8_l40_h100_mtp_fp8_repeat",
           "SGLang FP8 first": SERVE / "v3_fp8_tp8_l40_h100_mtp_fp8_third"}
WARM = ("snapmla first", "SGLang FP8 first")
LONG = SERVE / "v3_fp8_tp8_l40_h100_mtp_fp8_8k"
SECTION = "MTP against SGLang's FP8 cache (H100, 40 of the 61 layers, simulated acceptance)"
LABELS = {"snapmla": "snapmla", "snapmla-mtp-simulated": "snapmla, MTP", "flashmla-fp8": "SGLang FP8 cache",
          "flashmla-fp8-mtp-simulated": "SGLang FP8 cache, MTP"}
BASE = {"snapmla-mtp-simulated": "snapmla", "flashmla-fp8-mtp-simulated": "flashmla-fp8"}
# each snapmla run's counterpart on SGLang's FP8 cache, the same MTP setting
AGAINST = {"snapmla": "flashmla-fp8", "snapmla-mtp-simulated": "flashmla-fp8-mtp-simulated"}
SNAP, FP8 = "snapmla-mtp-simulated", "flashmla-fp8-mtp-simulated"


@functools.cache  # every figure reads the same folders: each file is read once
def runs(folder: Path) -> dict:
    return {r["run"]: r for r in read_json(folder / "serve_bench.json")}


@functools.cache
def stats(folder: Path, name: str) -> dict:
    return log_stats(read_log(folder / f"server_{name}.log.xz"))


def step(folder: Path, name: str) -> float:
    return stats(folder, name)["decode_step_ms_at_peak"]


def rate(folder: Path, name: str) -> float:
    return runs(folder)[name]["output_tok_s"]


def section() -> str:
    return doc_sections((ROOT / "docs/BENCHMARKS.md").read_text())[SECTION]


def text() -> str:
    return " ".join(section().split())


def printed(folders, figure, digits: int = 2) -> list[str]:
    """`figure` of each folder as the docs print a ratio ('1.03x')."""
    return [f"{figure(f):.{digits}f}x" for f in folders]


def over(folders, figure, digits: int = 2) -> str:
    """The ratio over the folders as the docs quote it: 'ax' where they agree, else 'lo-hix'."""
    return quoted_range(printed(folders, figure, digits))


@pytest.mark.parametrize("folder", [*FOLDERS.values(), LONG], ids=[*FOLDERS, "8k"])
def test_each_run_served_one_workload_at_40_layers_on_an_h100(folder):
    rows = runs(folder)
    assert set(rows) <= set(LABELS) and {SNAP, FP8} <= set(rows)
    assert len({repr(r["workload"]) for r in rows.values()}) == 1
    gpu = (folder / "gpu.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in gpu and "sglang 0.5.17" in gpu
    prompts = 32 if folder == LONG else 64
    for name, r in rows.items():
        assert r["completed"] == prompts and "error" not in r and r["peak_running_req"] == prompts - (folder != LONG)
        cmd = r["cmd"]
        assert "--max-running-requests 64" in cmd and "deepseek-v3-fp8-tp8" in cmd
        assert '--json-model-override-args {"num_hidden_layers":40}' in cmd
        simulated = f"SGLANG_SIMULATE_ACC_LEN={MTP_SIMULATED_ACCEPT}" in cmd
        assert simulated == (name in BASE) == ("--speculative-algorithm NEXTN" in cmd)
        assert (name.startswith("snapmla") == ("--attention-backend snapmla" in cmd)
                == ("--kv-cache-dtype fp8_e4m3" not in cmd))
        # the fan-in draw's scales, checked by the server on every attention layer (40, and the MTP layer's 2)
        log = read_log(folder / f"server_{name}.log.xz")
        assert "k_scale = v_scale = 1.0 on 80 attention layers (checked)" in log
        assert ("k_scale = v_scale = 1.0 on 2 attention layers (checked)" in log) == (name in BASE)


def test_the_table_is_the_kept_runs():
    rows = doc_tables(section())[0]
    assert [(row["run"], row["backend"]) for row in rows] == [
        (run, LABELS[name]) for run, folder in FOLDERS.items() for name in runs(folder)]  # the order they served in
    by_label = {(row["run"], row["backend"]): row for row in rows}
    for run, folder in FOLDERS.items():
        saved = runs(folder)
        for name, r in saved.items():
            row = by_label[(run, LABELS[name])]
            ratio = [r["output_tok_s"] / saved[AGAINST[name]]["output_tok_s"]] if name in AGAINST else []
            assert shows(row["output tok/s"], [r["output_tok_s"], *ratio]), row
            assert shows(row["TPOT p50 ms"], [r["median_tpot_ms"]]) and shows(row["TTFT p50 ms"], [r["median_ttft_ms"]])
            assert shows(row["accept length"], [r["accept_length"]]), row
            assert shows(row["decode step at 63 running, ms"], [step(folder, name)]), row
            base = BASE.get(name)
            step_ratio = [step(folder, name) / step(folder, base)] if base in saved else [None]
            assert shows(row["step vs the backend's without MTP"], step_ratio), row
            assert shows(row["prefill batch tok/s, median"], [stats(folder, name)["prefill_tok_s_median"]]), row


def test_the_text_quotes_the_table():
    t = text()
    every, warm = list(FOLDERS.values()), [FOLDERS[run] for run in WARM]
    both = [f for f in every if "snapmla" in runs(f)]  # the commands with every run
    assert f"snapmla's verify cycle is {over(every, lambda f: step(f, FP8) / step(f, SNAP))} faster" in t
    assert f"as its decode step is ({over(both, lambda f: step(f, 'flashmla-fp8') / step(f, 'snapmla'))})" in t
    snap_cost = over(both, lambda f: step(f, SNAP) / step(f, "snapmla"))
    fp8_cost = over(every, lambda f: step(f, FP8) / step(f, "flashmla-fp8"))
    assert f"a cycle costs {snap_cost} a decode step with snapmla and {fp8_cost} with SGLang FP8" in t
    accept = float(MTP_SIMULATED_ACCEPT)
    snap_gain, fp8_gain = (lambda f: accept * step(f, "snapmla") / step(f, SNAP),
                           lambda f: accept * step(f, "flashmla-fp8") / step(f, FP8))
    assert f"gives both {quoted_range(printed(both, snap_gain) + printed(every, fp8_gain))} the decode's" in t
    assert f"({over(both, snap_gain)} and {over(every, fp8_gain)} the decode's tokens a second)" in t
    assert (f"snapmla with MTP makes {over(warm, lambda f: rate(f, SNAP) / rate(f, FP8))} SGLang FP8's output rate "
            f"with MTP at {over(warm, lambda f: runs(f)[SNAP]['median_ttft_ms'] / runs(f)[FP8]['median_ttft_ms'])} "
            "its TTFT p50 in the two runs on a warm host") in t
    fresh = FOLDERS["fresh host"]
    assert f"({rate(fresh, SNAP) / rate(fresh, FP8):.2f}x in a fresh host's first command" in t
    assert (f"({over(warm, lambda f: rate(f, SNAP) / rate(f, 'snapmla'))} and "
            f"{over(warm, lambda f: rate(f, FP8) / rate(f, 'flashmla-fp8'))} on the warm host)") in t
    snap_pre, fp8_pre = ([stats(f, n)["prefill_tok_s_median"] / 1e3 for f in every for n in runs(f)
                          if n.startswith("snapmla") == snapmla] for snapmla in (True, False))
    assert (f"prefill batches run at {min(snap_pre):.1f}-{max(snap_pre):.1f} k tokens/s against SGLang FP8's "
            f"{min(fp8_pre):.1f}-{max(fp8_pre):.1f} k") in t
    gaps = (over(both, lambda f: step(f, "flashmla-fp8") - step(f, "snapmla"), digits=1),
            over(every, lambda f: step(f, FP8) - step(f, SNAP), digits=1))
    assert f"snapmla's step is {gaps[0][:-1]} ms shorter, its cycle {gaps[1][:-1]} ms" in t  # ms, not x


def test_the_longer_prompts_paragraph_is_its_run():
    t, r = text(), runs(LONG)
    assert f"snapmla with MTP makes {rate(LONG, SNAP):.0f} output tok/s against SGLang FP8's {rate(LONG, FP8):.0f}" in t
    assert f"({rate(LONG, SNAP) / rate(LONG, FP8):.2f}x)" in t
    ttft = (r[SNAP]["median_ttft_ms"] / 1e3, r[FP8]["median_ttft_ms"] / 1e3)
    assert f"at {ttft[0]:.1f} against {ttft[1]:.1f} s TTFT p50 ({ttft[0] / ttft[1]:.2f}x)" in t
    assert (f"its cycle at 32 requests {step(LONG, SNAP):.1f} ms against {step(LONG, FP8):.1f} "
            f"({step(LONG, FP8) / step(LONG, SNAP):.2f}x)") in t
    # "the one decode line SGLang logged at the peak after the prefill": two lines at 32 running, the first of which
    # follows the last prefill batch (its rate counts that batch's time), so the step reads the second alone
    for name in (SNAP, FP8):
        lines = [ln for ln in read_log(LONG / f"server_{name}.log.xz").splitlines()
                 if "Decode batch" in ln and "#running-req: 32," in ln]
        assert len(lines) == 2, lines


def test_the_fresh_hosts_first_use_costs_are_its_logs():
    """The first 8 192-token prefill batch of snapmla's MTP bench, on the fresh host and on the warm one, as the
    paragraph under the table quotes them (the log's input throughput of that batch)."""
    import re

    def first_full_batch(folder: Path) -> float:
        for line in read_log(folder / f"server_{SNAP}.log.xz").splitlines():
            m = re.search(r"#new-token: 8192,.*input throughput \(token/s\): ([\d.]+)", line)
            if m:
                return float(m.group(1)) / 1e3
        raise AssertionError(folder)

    fresh, warm = first_full_batch(FOLDERS["fresh host"]), first_full_batch(FOLDERS["snapmla first"])
    assert f"ran at {fresh:.1f} k tokens/s there, at {warm:.1f} k on the warm host" in text()
    startup = runs(FOLDERS["fresh host"])["flashmla-fp8"]["startup_s"]
    assert f"compiled Triton's FP8 kernels for {startup:.0f} s" in text()
