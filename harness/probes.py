"""Greedy probes of a trained checkpoint through an SGLang server (tools/train_tiny_mla.py writes its held-out
prompts): the probes and the filler requests they decode among, their outputs at a concurrency level, and how two
runs' outputs compare. The accuracy gate, the FP8 outlier sweep and the trained-model evaluation share them."""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from harness.server import greedy_generate

PROBES, PROBE_TOKENS, FILLER_TOKENS = 32, 16, 160
# The pool is capped (the same for every run) because SGLang 0.5.17's FP8 paths for MLA dequantize a layer's whole pool
# at once: flashmla's prefix extend (the radix level, chunked prefill) and FlashInfer MLA's every step cast
# get_key_buffer(layer) to BF16. At SGLang's default memory fraction that copy of the small trained model's per-layer
# pool (4 layers) asks for 31 GiB and the server dies of CUDA OOM (docs/ACCURACY.md). 600k tokens hold the largest
# concurrency the tools use (512 requests of up to 1 120 tokens).
POOL_TOKENS = 600_000
POOL_FLAGS = ["--max-total-tokens", str(POOL_TOKENS)]


def workload(held: dict, fillers: int) -> tuple[list[list[int]], list[list[int]]]:
    """(probes, fillers): the first PROBES held-out prompts, and `fillers` slices of varied length (64..960 tokens)
    of the held-out windows (heldout.json of tools/train_tiny_mla.py)."""
    probes = held["prompts"][:PROBES]
    windows = held["ppl_windows"]
    out = []
    for i in range(fillers):
        w = windows[i % len(windows)]
        length = 64 + (i * 97) % 897
        start = (i * 31) % max(1, len(w) - length)
        out.append(w[start:start + length])
    return probes, out


def generate_level(port: int, probes, fillers, level: int) -> list[dict]:
    """The probes' greedy outputs (ids, logprobs) at `level` concurrent requests."""
    def probe(ids):
        r = greedy_generate(port, ids, PROBE_TOKENS, return_logprob=True)
        return {"ids": r["output_ids"], "logprobs": [t[0] for t in r["meta_info"]["output_token_logprobs"]]}

    if level == 1:
        return [probe(p) for p in probes]
    out = []
    group = min(level, len(probes))
    for g in range(0, len(probes), group):
        batch = probes[g:g + group]
        n_fill = level - len(batch)
        with ThreadPoolExecutor(level) as ex:
            filling = [ex.submit(greedy_generate, port, f, FILLER_TOKENS) for f in fillers[:n_fill]]
            time.sleep(0.5 if n_fill else 0)  # the fillers are admitted first: the probes decode among them
            out.extend(ex.map(probe, batch))
            for f in filling:
                f.result()
    return out


def token_errors(run: list[dict], ref: list[dict]) -> tuple[float, int]:
    """(mean |logprob difference| over the tokens before the first differing token, probes identical to ref)."""
    diffs, same = [], 0
    for a, b in zip(run, ref):
        n = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y), len(a["ids"]))
        # token n itself is compared too: both generated it from the same context (they differ in the choice).
        # A missing logprob is a non-finite one (the server returns NaN as null): an infinite error.
        diffs += [abs(x - y) if x is not None and y is not None else math.inf
                  for x, y in zip(a["logprobs"][: n + 1], b["logprobs"][: n + 1])]
        same += a["ids"] == b["ids"]
    return statistics.fmean(diffs), same


def agreement(a: list[list[int]], b: list[list[int]], start: int = 0, end: int | None = None) -> float:
    """Fraction of positions [start, end) where two sets of generations hold the same token."""
    same = total = 0
    for x, y in zip(a, b):
        xs, ys = x[start:end], y[start:end]
        same += sum(u == v for u, v in zip(xs, ys))
        total += max(len(xs), len(ys))
    return same / max(1, total)
