"""Greedy probes of a trained checkpoint through an SGLang server (tools/train_tiny_mla.py writes its held-out
prompts): the probes and the filler requests they decode among, their outputs at a concurrency level, and how two
runs' outputs compare. The accuracy gate, the FP8 outlier sweep and the trained-model evaluation share them."""

from __future__ import annotations

import math
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from harness.server import abort_request, greedy_generate, stream_generate

PROBES, PROBE_TOKENS = 32, 16
# how long the probes wait for every filler of a level to be decoding before they are sent anyway
FILLER_ADMIT_TIMEOUT_S = 120
# The pool is capped (the same for every run) because SGLang 0.5.17's FP8 paths for MLA dequantize a layer's whole pool
# at once: flashmla's prefix extend (the radix level, chunked prefill) and FlashInfer MLA's every step cast
# get_key_buffer(layer) to BF16. At SGLang's default memory fraction that copy of the small trained model's per-layer
# pool (4 layers) asks for 31 GiB and the server dies of CUDA OOM (docs/ACCURACY.md).
POOL_TOKENS = 600_000
# A filler decodes until its level's probes have returned and is then aborted. It may ask for at most this many new
# tokens (a 4096-token context holds them beside the longest filler, 960 tokens), and no more than the capped pool
# holds for all of the level's fillers and probes at once (`filler_tokens`), so that none is retracted.
FILLER_TOKENS_MAX = 2048
ABORT_THREADS = 32
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


def filler_tokens(fillers: list[list[int]], probes: list[list[int]]) -> int:
    """New tokens each filler asks for: FILLER_TOKENS_MAX, or less where 9/10 of POOL_TOKENS would not hold every
    filler and probe at its full length (the rest is the scheduler's headroom)."""
    room = POOL_TOKENS * 9 // 10 - sum(map(len, fillers)) - sum(len(p) + PROBE_TOKENS for p in probes)
    tokens = min(FILLER_TOKENS_MAX, room // max(1, len(fillers)))
    if tokens < 4 * PROBE_TOKENS:
        raise ValueError(f"{len(fillers)} fillers of {sum(map(len, fillers))} tokens leave {room} tokens of the "
                         f"{POOL_TOKENS}-token pool: too few to outlast the probes; use fewer or shorter fillers")
    return tokens


def generate_level(port: int, probes, fillers, level: int) -> list[dict]:
    """The probes' greedy outputs at `level` concurrent requests: per probe {"ids", "logprobs"}, and where fillers
    ran {"fillers", "fillers_running"}: how many were sent beside it, and how many of them were decoding when it was
    sent and still decoding when it returned (all of them: the probe decoded inside a batch that held every filler).

    The probes are sent once every filler is decoding (its first streamed token) or after FILLER_ADMIT_TIMEOUT_S
    (a server that cannot admit them all at once); the fillers ask for `filler_tokens` new tokens and are aborted once
    the probes have returned. Neither a sleep before the probes nor a short fixed filler length holds the batch: on a
    fast host the first fillers of a small model decode 160 tokens before the server has admitted the last ones, and
    the probes then decode in a smaller batch (another split count)."""
    def probe(ids, decoding):
        """(its output, the fillers decoding when it was sent, when it returned)"""
        started = [i for i, ev in enumerate(decoding) if ev.is_set()]
        r = greedy_generate(port, ids, PROBE_TOKENS, return_logprob=True)
        output = {"ids": r["output_ids"], "logprobs": [t[0] for t in r["meta_info"]["output_token_logprobs"]]}
        return output, started, time.monotonic()

    out = []
    group = min(level, len(probes))
    for g in range(0, len(probes), group):
        batch = probes[g:g + group]
        n_fill = level - len(batch)
        decoding = [threading.Event() for _ in range(n_fill)]
        # SGLang aborts every request whose id starts with the one given: ids of one length, none a prefix of another
        rids = [uuid.uuid4().hex for _ in range(n_fill)]
        new_tokens = filler_tokens(fillers[:n_fill], batch) if n_fill else 0
        with ThreadPoolExecutor(level) as ex:
            filling = [ex.submit(stream_generate, port, f, new_tokens, ev, rid)
                       for f, ev, rid in zip(fillers[:n_fill], decoding, rids)]
            try:
                wait_decoding(decoding, filling, FILLER_ADMIT_TIMEOUT_S)
                done = list(ex.map(lambda ids: probe(ids, decoding), batch))
            except BaseException:
                abort_fillers(port, rids, quiet=True)  # the server may be what failed: its error is the one to see
                raise
            abort_fillers(port, rids)  # the probes have returned: the fillers leave the batch for the next level
            left_at = [f.result() for f in filling]
        for output, started, returned_at in done:
            if n_fill:  # decoding before the probe was sent and still decoding when it returned
                output |= {"fillers": n_fill, "fillers_running": sum(left_at[i] > returned_at for i in started)}
            out.append(output)
    return out


def abort_fillers(port: int, rids: list[str], quiet: bool = False) -> None:
    """Abort the fillers `rids` (SGLang's /abort_request, one request id per call), ABORT_THREADS calls at a time:
    one after another, a server busy decoding hundreds of streams takes seconds to leave them all. `quiet`: a server
    that does not answer is not an error."""
    def abort(rid):
        try:
            abort_request(port, rid)
        except OSError:
            if not quiet:
                raise

    with ThreadPoolExecutor(max(1, min(ABORT_THREADS, len(rids)))) as ex:
        list(ex.map(abort, rids))


def wait_decoding(decoding: list[threading.Event], filling: list, timeout: float) -> None:
    """Until every filler is decoding or `timeout` s have passed; a filler's error is raised at once."""
    deadline = time.monotonic() + timeout
    while not all(ev.is_set() for ev in decoding) and time.monotonic() < deadline:
        for f in filling:
            if f.done() and f.exception() is not None:
                raise f.exception()
        time.sleep(0.02)


def held(level: list[dict]) -> tuple[int, int]:
    """(fewest fillers any probe of a level decoded among, fillers sent beside it); (0, 0) without fillers."""
    counted = [(p["fillers_running"], p["fillers"]) for p in level if "fillers" in p]
    return min(counted, default=(0, 0))


def first_difference(a: list, b: list) -> int:
    """The index of the first token where two generations differ; the shorter one's length where none does."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def token_errors(run: list[dict], ref: list[dict]) -> tuple[float, int]:
    """(mean |logprob difference| over the tokens before the first differing token, probes identical to ref)."""
    diffs, same = [], 0
    for a, b in zip(run, ref):
        n = first_difference(a["ids"], b["ids"])
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
