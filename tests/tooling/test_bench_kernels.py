"""The kernel benchmark's FlashInfer per-token FP8 cache (benchmarks/bench_kernels.py), on the CPU: the format
FlashInfer 0.7's `ckv_scale_arr` reads, built from the same rows the other columns time."""

import torch

from benchmarks.bench_kernels import FLASHINFER_SCALE_BLOCK, flashinfer_fp8_per_token
from sglang_snapmla import numerics as nx


def test_flashinfer_per_token_cache_scales_each_128_channel_block():
    """One fp32 scale per token and 128-channel block (amax / 448, floored), the RoPE key at one tensor scale; a block
    1e4 times smaller than its neighbours keeps its own precision, and an all-zero row gets the floor, not 0."""
    gen = torch.Generator().manual_seed(0)
    ckv = torch.randn(64, 512, generator=gen)
    ckv[:, 128:256] *= 1e-4  # one quiet block per token
    ckv[5] = 0.0
    ckv = ckv.to(torch.bfloat16)
    kpe = (torch.randn(64, 64, generator=gen) * 30).to(torch.bfloat16)
    ckv8, scales, kpe8, kpe_scale = flashinfer_fp8_per_token(ckv, kpe)
    assert ckv8.dtype == kpe8.dtype == nx.FP8_DTYPE and scales.dtype == torch.float32
    assert ckv8.shape == (64, 512) and scales.shape == (64, 512 // FLASHINFER_SCALE_BLOCK) and kpe8.shape == (64, 64)
    blocks = ckv.float().view(64, 4, FLASHINFER_SCALE_BLOCK)
    assert torch.equal(scales, torch.clamp_min(blocks.abs().amax(-1) / nx.FP8_MAX, nx.SCALE_FLOOR))
    assert torch.all(scales[5] == nx.SCALE_FLOOR)
    back = (ckv8.float().view(64, 4, FLASHINFER_SCALE_BLOCK) * scales[..., None]).view(64, 512)
    quiet, loud = (slice(None), slice(128, 256)), (slice(None), slice(256, 512))
    for part in (quiet, loud):  # e4m3: ~2^-4 relative per element, far less over a block
        err = (back[part] - ckv.float()[part]).norm() / ckv.float()[part].norm()
        assert err < 0.04, err
    assert kpe_scale == torch.clamp_min(kpe.float().abs().amax() / nx.FP8_MAX, nx.SCALE_FLOOR).item()
    kpe_err = (kpe8.float() * kpe_scale - kpe.float()).norm() / kpe.float().norm()
    assert kpe_err < 0.04, kpe_err


def test_the_committed_h200_kernel_table_is_what_the_readme_quotes():
    """results/bench/kernels_h200.json.xz (one run of bench_kernels on an H200) gives every kernel ratio the README's
    measurement table quotes: snapmla's sm_90a decode against FlashMLA BF16 / FlashMLA FP8 of the same run."""
    from pathlib import Path

    from harness.results import read_json

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    us = {(r["kernel"], r["h"], r["b"], r["sk"]): r["us"]
          for r in read_json(root / "results" / "bench" / "kernels_h200.json")["results"] if r["s_q"] == 1}
    quoted = {(16, 128, 16384): "1.73x / 1.31x", (16, 64, 65536): "1.82x / 1.37x", (32, 128, 16384): "1.76x / 1.42x",
              (32, 64, 65536): "1.74x / 1.33x", (8, 128, 16384): "1.71x / 1.32x", (64, 128, 16384): "1.40x / 1.10x",
              (128, 128, 16384): "1.23x / 1.00x", (128, 64, 65536): "1.23x / 1.02x", (16, 1, 640): "1.42x / 1.34x",
              (128, 1, 640): "1.19x / 1.18x"}
    for shape, text in quoted.items():
        ours = us[("snapmla_cuda_sm90", *shape)]
        ratios = f"{us[('flashmla_bf16', *shape)] / ours:.2f}x / {us[('flashmla_fp8_pertensor', *shape)] / ours:.2f}x"
        assert ratios == text and text in readme, (shape, ratios, text)


def test_other_fp8_decodes_section_quotes_its_committed_runs():
    """docs/BENCHMARKS.md "Other FP8 MLA decodes": each H200 row of the paper's grid and of FlashInfer's per-token
    table is the committed run's (µs, ratios against FlashMLA BF16 and FP8, rel-L2), recomputed here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    from helpers import doc_sections

    section = doc_sections((root / "docs" / "BENCHMARKS.md").read_text())["Other FP8 MLA decodes (H200)"]
    lines = section.splitlines()

    grid = {**_by_shape("kernels_h200_paper_grid_h128.json"), **_by_shape("kernels_h200_paper_grid_h64.json")}
    assert len(grid) == 17
    for (h, b, sk), d in grid.items():
        ours, bf16, fp8 = (d[k]["us"] for k in ("snapmla_cuda_sm90", "flashmla_bf16", "flashmla_fp8_pertensor"))
        if sk == 33280:
            row = next(ln for ln in lines if ln.startswith(f"| {h} | 1 / 8 / 32 |"))
            assert f"{bf16:.1f} / {ours:.1f}" in row and f"{bf16 / ours:.2f}x" in row and f"{fp8 / ours:.2f}x" in row
            continue
        row = next(ln for ln in lines if ln.startswith(f"| {h} | {b} | {sk:,} |".replace(",", " ")))
        cells = [c.strip().strip("*") for c in row.split("|")[1:-1]]
        assert cells[5:] == [f"{bf16:.1f} / {ours:.1f}", f"{bf16 / ours:.2f}x", f"{fp8 / ours:.2f}x"], row
    per_token = _by_shape("kernels_h200_flashinfer_per_token.json")
    for (h, b, sk), d in per_token.items():
        fi, ours = d["flashinfer_fa3_fp8_per_token"], d["snapmla_cuda_sm90"]
        row = next(ln for ln in lines if ln.startswith(f"| {h} | {b} | {sk:,} |".replace(",", " ")) and "/ 0.0" in ln)
        assert f"({fi['speedup_vs_flashmla_bf16']:.2f}x)" in row and f"({ours['speedup_vs_flashmla_bf16']:.2f}x)" in row
        assert f"{fi['us'] / ours['us']:.1f}x" in row
        assert f"{fi['rel_err_vs_flashmla_bf16']:.4f} / {ours['rel_err_vs_flashmla_bf16']:.4f}" in row


def test_redraw_prints_and_plots_a_saved_run_without_a_gpu(tmp_path, monkeypatch, capsys):
    """`bench_kernels --redraw JSON`: the table of a committed run and its plot beside the JSON, on the CPU."""
    import shutil
    import sys
    from pathlib import Path

    from benchmarks import bench_kernels
    from harness.results import stored

    saved = stored(Path(__file__).resolve().parents[2] / "results/bench/kernels_h200_paper_grid_h128.json")
    copy = tmp_path / saved.name
    shutil.copy(saved, copy)
    monkeypatch.setattr(sys, "argv", ["bench_kernels", "--redraw", str(copy)])
    bench_kernels.main()
    assert "| 128 | 1 | 128 | 640 |" in capsys.readouterr().out
    assert (tmp_path / "kernels_h200_paper_grid_h128.png").stat().st_size > 0


def test_kernel_doc_quotes_the_serving_plan_run_and_the_short_context_profiles():
    """docs/KERNEL.md: the serving-plan times (bench_kernels --context-len 163840) are the committed run's, planned at
    the server's static bound (63 splits at h128 b1 s_k 640); the ncu table's cycles, waves and local-memory requests
    are the committed ncu reports'."""
    import lzma
    import re
    from pathlib import Path

    from harness.results import read_json

    root = Path(__file__).resolve().parents[2]
    doc = " ".join((root / "docs" / "KERNEL.md").read_text().split())
    run = read_json(root / "results/bench/kernels_h200_short_context_serving_plan.json.xz")["results"]
    us = {(r["h"], r["b"], r["sk"], r["kernel"]): r for r in run}
    for h, b in ((128, 1), (128, 8), (64, 1), (64, 8)):
        ours, bf16 = us[h, b, 640, "snapmla_cuda_sm90"], us[h, b, 640, "flashmla_bf16"]
        assert ours["context_len"] == 163840
        quoted = f"b{b} {ours['us']:.1f}" if b == 8 else f"h{h} b1 s_k 640 {ours['us']:.1f}" if h == 128 else \
            f"h{h} b1 {ours['us']:.1f}"
        assert f"{quoted} µs against FlashMLA BF16's {bf16['us']:.1f}" in doc or \
            f"{quoted} against {bf16['us']:.1f} ({bf16['us'] / ours['us']:.2f}x)" in doc, (h, b)
    assert us[128, 1, 640, "snapmla_cuda_sm90"]["splits"] == 63
    for shape, ctas in (("b64_640", 128), ("b128_640", 256), ("b256_1280", 512)):
        text = lzma.open(root / f"results/bench/ncu_h128_short_context/wide_h128_{shape}.details.txt.xz", "rt").read()
        cycles = int(re.search(r"Elapsed Cycles\s+cycle\s+([\d,]+)", text).group(1).replace(",", ""))
        waves = re.search(r"Waves Per SM\s+([\d.]+)", text).group(1)
        spills = int(re.search(r"Local Memory Spilling Requests\s+([\d,]+)", text).group(1).replace(",", ""))
        b, sk = shape.split("_")
        row = f"| h128 {b} s_k {int(sk):,} | {ctas} | {waves} |".replace(",", " ")
        assert row in doc and f"| {cycles:,} |".replace(",", " ") in doc, row
        assert f"| {round(spills / ctas):,} |".replace(",", " ") in doc, shape


def _fmt(x: float) -> str:
    return f"{x:,.1f}".replace(",", " ")


def _by_shape(name: str) -> dict:
    """A bench_kernels run in results/bench/ as {(heads, batch, s_k): {kernel: row}}."""
    from pathlib import Path

    from harness.results import read_json

    out = {}
    for r in read_json(Path(__file__).resolve().parents[2] / "results" / "bench" / name)["results"]:
        out.setdefault((r["h"], r["b"], r["sk"]), {})[r["kernel"]] = r
    return out


def test_kernel_doc_quotes_the_q_quant_blocks_run():
    """docs/KERNEL.md's Q-quant table is results/bench/q_quant_rows_h100.json (benchmarks/gpu/q_quant_rows.py): every
    block size's time, the block the plan picks now (`decode_plan.q_quant_rows`) and the copy of the same bytes."""
    from pathlib import Path

    from harness.results import read_json
    from sglang_snapmla import decode_plan

    root = Path(__file__).resolve().parents[2]
    doc = " ".join((root / "docs" / "KERNEL.md").read_text().split())
    run = read_json(root / "results/bench/q_quant_rows_h100.json")
    assert run["meta"]["min_programs"] == decode_plan.Q_QUANT_MIN_PROGRAMS
    assert run["meta"]["max_rows"] == decode_plan.Q_QUANT_MAX_ROWS
    for r in run["results"]:
        plan = decode_plan.q_quant_rows(r["tokens"], r["heads"])
        assert plan == r["plan_rows"], r
        by = r["us_by_rows"]
        row = (f"| {r['tokens']:,} x {r['heads']} | ".replace(",", " ") + " | ".join(_fmt(by[str(n)]) for n in
               (1, 2, 4, 8, 16)) + f" | {plan}: {_fmt(by[str(plan)])} | {_fmt(r['copy_us'])} |")
        assert row in doc, row
    at = {(r["tokens"], r["heads"]): r["us_by_rows"] for r in run["results"]}
    gains = [at[t, 128]["1"] / at[t, 128][str(decode_plan.q_quant_rows(t, 128))] for t in (32, 64, 128, 256)]
    assert f"{min(gains):.1f}-{max(gains):.1f}x faster than one row a program from 32 x 128 up" in doc, gains
    ratios = [at[t, 128][str(decode_plan.q_quant_rows(t, 128))] / r["copy_us"] for t in (64, 128)
              for r in run["results"] if (r["tokens"], r["heads"]) == (t, 128)]
    quote = f"within {min(ratios):.2f}-{max(ratios):.2f}x of a copy of the same bytes at 64 x 128 and 128 x 128"
    assert quote in doc, ratios


def test_the_q_quant_division_figures_are_the_kept_runs():
    """docs/KERNEL.md's "The Q-quant's division" quotes the exhaustive sweep (results/bench/q_division_sweep.json) and
    the per-value division's Q-quant run; docs/BENCHMARKS-H100.md's table of the chain with the reciprocal quotients
    is its kept run, row by row."""
    from pathlib import Path

    from harness.results import read_json
    from sglang_snapmla import decode_plan

    root = Path(__file__).resolve().parents[2]
    kernel = " ".join((root / "docs" / "KERNEL.md").read_text().split())
    sweep = read_json(root / "results/bench/q_division_sweep.json")
    assert sweep["stride"] == 1 and sweep["corrected"] == {"fp8": 0, "fp32": 0, "examples": []}
    n = {k: f"{v:,}".replace(",", " ") for k, v in (("amaxes", sweep["amaxes"]), ("pairs", sweep["pairs"]),
                                                     ("bytes", sweep["reciprocal"]["fp8"]))}
    assert (f"{n['amaxes']} amaxes, {n['pairs']} (value, scale) pairs, none differs; x r alone differs in "
            f"{n['bytes']} fp8 bytes") in kernel
    div_run = read_json(root / "results/bench/q_quant_rows_div_rn_h100.json")
    div = {(r["tokens"], r["heads"]): r for r in div_run["results"]}
    now = {(r["tokens"], r["heads"]): r for r in read_json(root / "results/bench/q_quant_rows_h100.json")["results"]}
    plan = lambda r: r["us_by_rows"][str(r["plan_rows"])]  # noqa: E731
    quoted = [f"{_fmt(plan(div[k]))} at {k[0]:,} x {k[1]} ({_fmt(plan(now[k]))}".replace(",", " ")
              for k in ((64, 128), (256, 128), (1024, 16))]
    quoted.append(f"{_fmt(plan(div[128, 128]))} µs at 128 x 128 ({_fmt(plan(now[128, 128]))} above)")
    for q in quoted:
        assert q in kernel, q
    copies = [abs(div[k]["copy_us"] - now[k]["copy_us"]) for k in now]
    assert max(copies) <= 0.2 + 1e-9, copies
    gains = [div[t, 128]["us_by_rows"]["1"] / plan(div[t, 128]) for t in (32, 64, 128, 256)]
    assert f"with the plan's block {min(gains):.2f}-{max(gains):.2f}x faster than one row a program" in kernel, gains
    assert all(decode_plan.q_quant_rows(*k) == r["plan_rows"] for k, r in div.items())

    bench = " ".join((root / "docs" / "BENCHMARKS-H100.md").read_text().split())
    shapes = _by_shape("kernels_h100_short_context_q_reciprocal.json.xz")
    assert len(shapes) == 10
    for (h, b, sk), k in shapes.items():
        ours, bf, f8 = k["snapmla_cuda_sm90"], k["flashmla_bf16"]["us"], k["flashmla_fp8_pertensor"]["us"]
        assert ours["context_len"] == 163840
        cells = [f"{h}", f"{b}", f"{sk:,}".replace(",", " "), f"{ours['splits']}", f"{ours['us']:.1f}", f"{bf:.1f}",
                 f"{f8:.1f}"]
        row = "| " + " | ".join(cells) + " | "
        vs_bf16 = f"{bf / ours['us']:.2f}x"
        assert f"{row}{vs_bf16} |" in bench or f"{row}**{vs_bf16}** |" in bench, (row, vs_bf16)


def test_kernel_doc_and_readme_quote_the_short_context_decode_chain():
    """docs/KERNEL.md's decode-chain table at 128 / 64 / 16 heads (bench_kernels --context-len 163840) and the README's
    128-head short-context row are results/bench/kernels_h200_short_context_h128_h64_h16.json.xz."""
    from pathlib import Path

    from harness.results import read_json

    root = Path(__file__).resolve().parents[2]
    doc = " ".join((root / "docs" / "KERNEL.md").read_text().split())
    readme = (root / "README.md").read_text()
    run = read_json(root / "results/bench/kernels_h200_short_context_h128_h64_h16.json.xz")["results"]
    us = {(r["h"], r["b"], r["sk"], r["kernel"]): r["us"] for r in run if r["s_q"] == 1}
    assert {r["context_len"] for r in run if r["kernel"] == "snapmla_cuda_sm90"} == {163840}

    def cells(h, b, sk):
        ours, bf16, fp8 = (us[h, b, sk, k] for k in ("snapmla_cuda_sm90", "flashmla_bf16", "flashmla_fp8_pertensor"))
        return ours, bf16, fp8, f"{bf16 / ours:.2f}x", f"{fp8 / ours:.2f}x"

    for h, b, sk in ((128, 1, 640), (128, 64, 640), (128, 128, 640), (128, 256, 1280), (128, 128, 4096),
                     (64, 64, 640), (64, 128, 640), (64, 256, 1280)):
        ours, bf16, fp8, r_bf16, r_fp8 = cells(h, b, sk)
        row = f"| {h} | {b} x {sk:,} | {_fmt(ours)} | {_fmt(bf16)} | {_fmt(fp8)} | {r_bf16} | {r_fp8} |"
        assert row.replace(",", " ") in doc, row
    sixteen = [cells(16, b, sk) for b, sk in ((64, 640), (128, 640), (256, 1280), (128, 4096))]

    def spread(i, unit=""):  # "lo-hi" over the 16-head shapes; ratios as "1.30-1.57x"
        vals = sorted(c[i] for c in sixteen)
        return f"{vals[0]:.1f}-{vals[-1]:.1f}" if not unit else f"{vals[0][:-1]}-{vals[-1]}"

    row = f"| 16 | 64-256 x 640-4 096 | {spread(0)} | {spread(1)} | {spread(2)} | {spread(3, 'x')} | {spread(4, 'x')} |"
    assert row in doc, row
    quoted = "; ".join(" / ".join(cells(128, b, 640)[3:]) for b in (64, 128))
    assert f"**{quoted}**" in readme, quoted
