"""Soak a running SGLang server with what clients send: complete, streamed-and-cut, aborted and malformed requests
over shared prefixes, for a set time, then check that it is still the server it was.

    python -m tools.soak --port 21000 --seconds 300 --clients 160 --server-log server.log --out soak_out
    python -m tools.soak --start snapmla --model CKPT --server-flags "--max-total-tokens 65536" --out soak_out
(the second starts the server itself, `harness.server.RUNS[backend]` with metrics on, the checkpoint's weights, and
stops it afterwards; its log is `--out`/server.log)

Load (`--clients` threads until `--seconds` pass, each drawing a request kind by WEIGHTS): `complete` (/generate,
greedy, whole response), `cut` (a stream read for a few chunks, then the connection closed), `abort` (a stream
with its own rid, aborted through /abort_request after its first chunk), `malformed` (MALFORMED: broken JSON,
wrong types, token ids outside the vocabulary, negative lengths). Prompts are token ids: a few shared prefixes
(PREFIXES groups) plus a random tail, so the radix cache shares pages and the pool can be made small enough to force
retractions. Probes (fixed greedy prompts, `--probes`) run alone before the load, once inside it and alone after.

Checks (the table, JSON under --out; exit 1 if one fails): no 5xx or connection error for a well-formed request;
every well-formed request answered within the client's timeout (`--client-timeout`, 120 s: a request still unanswered
then is counted apart from a broken connection, status TIMED_OUT, shown as "timed out");
every malformed request answered 4xx with a message; the server's tokens in use back to 0 once idle (its
/metrics gauge, `--enable-metrics`); probes after == probes before; after a warm-up, the server idle before the
probes before; /health answers; no traceback in the server log;
with `--min-retractions N`, at least N requests retracted by the scheduler (its "#retracted_reqs" log lines: the
pool was small enough to force them). The retracted count is reported either way.

`--warmup-seconds N` runs the same load for N seconds before the probes before, unchecked (its statuses are kept
apart): a fresh host's first batches compile kernels (FlashInfer's sampling kernels at the first batch that mixes
greedy and sampled requests, 86 s on an H200, docs/DEPLOY.md "Start-up time"; SGLang's Triton kernels for new batch
sizes) and stall the scheduler for a minute or more, which the timeout check would otherwise count. The probes
before then wait until the server is idle (its /metrics: no request running, queued or holding pool tokens; the
warm-up's requests whose clients gave up are still served), up to the client's timeout plus `--idle-seconds`, and a
check says they did: probes batched with other requests are another computation.

`--finish-by S` bounds the whole run, the server's start included, to S seconds from the tool's start (a host that
ends a command at a time limit): the measured load gets what is left after the idle wait, probes as long as the
probes before took and FINISH_MARGIN_S, at most `--seconds`; a check fails where that leaves less than
`--min-load-seconds`. soak.json keeps the asked length (`seconds_asked`) beside the one run (`seconds`).

The probes after run over a radix cache that holds their prompts, so they prefill only a last page over the cached
ones: on a trained checkpoint that checks the prefix path too. On dummy weights (`--load-format dummy`) the logits are
near-flat and another computation can flip the greedy tokens from the first one on, so there
`--flush-before-probes-after` empties the radix cache first (and checks that /flush_cache answered 200): the probes
after are then the computation of the probes before, over a pool the load has used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

WEIGHTS = {"complete": 0.45, "cut": 0.25, "abort": 0.15, "malformed": 0.15}
PREFIXES, PREFIX_LEN = 8, 512
FINISH_MARGIN_S = 20  # --finish-by: kept for what is not timed ahead (the /health call, the log's read, the JSON)
VOCAB_FALLBACK = 32000
# name -> (body as bytes, or a function of the vocabulary size giving the JSON payload)
MALFORMED = {
    "broken-json": lambda v: b'{"input_ids": [1, 2, 3], "sampling_params": {',
    "text-and-ids-missing": lambda v: {"sampling_params": {"max_new_tokens": 4}},
    "ids-not-ints": lambda v: {"input_ids": ["a", None, 3], "sampling_params": {"max_new_tokens": 4}},
    "id-above-vocab": lambda v: {"input_ids": [1000000000, -5, 3], "sampling_params": {"max_new_tokens": 4}},
    "id-at-vocab": lambda v: {"input_ids": [1, v], "sampling_params": {"max_new_tokens": 4}},
    "negative-id": lambda v: {"input_ids": [5, -1, 7], "sampling_params": {"max_new_tokens": 4}},
    "stop-id-above-vocab": lambda v: {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 2,
                                                                               "stop_token_ids": [v + 7]}},
    "negative-max-new-tokens": lambda v: {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": -3}},
    "temperature-not-a-number": lambda v: {"input_ids": [5, 6], "sampling_params": {"temperature": "hot"}},
    "top-logprobs-above-vocab": lambda v: {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": v + 5,
                                           "sampling_params": {"max_new_tokens": 4}},
}

# The kinds whose ids SGLang 0.5.17 sends to the GPU unchecked (sglang PR #8383): the first one kills a server
# without snapmla's request checks (the embedding gather's device-side assert ends the scheduler); and a top-logprob
# count above the vocabulary, which SGLang passes to torch.topk in the scheduler (sglang_snapmla.request_checks).
# --without-out-of-range-ids leaves them out, for a soak of another backend that measures the rest.
OUT_OF_RANGE_IDS = ("id-above-vocab", "id-at-vocab", "negative-id", "stop-id-above-vocab", "top-logprobs-above-vocab")


# the status of a request the client gave up on: no answer within its timeout (a stalled server, not a broken one)
TIMED_OUT = -1
# SGLang's /metrics gauges that are 0 on an idle server: no request holds pool tokens, runs or waits. A request the
# client gave up on (TIMED_OUT, a cut stream) still runs to its end in the scheduler.
IDLE_GAUGES = ("num_used_tokens", "num_running_reqs", "num_queue_reqs")
# An idle SGLang 0.5.17 scheduler republishes those gauges only 30 s after its last report, unless its running gauge
# disagrees with the running batch (scheduler_components/metrics_reporter.py): after a last report from a prefill
# with none running, a shorter idle wait reads the pool tokens that prefill held. --idle-seconds is at least this.
MIN_IDLE_SECONDS = 40


def failed_status(exc: Exception) -> int:
    """TIMED_OUT for a read or connect that ran past the client's timeout, 0 for any other failed or broken
    connection (urllib wraps a connect timeout in URLError)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return TIMED_OUT if isinstance(reason, TimeoutError) else 0


class Server:
    """The few HTTP calls the soak makes, against 127.0.0.1:port."""

    def __init__(self, port: int, timeout: float = 120):
        self.port, self.timeout = port, timeout

    def post(self, path: str, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        """(status, body); status 0 for a connection that failed or broke, TIMED_OUT for no answer in time."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, http.client.HTTPException) as e:
            return failed_status(e), b""

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, http.client.HTTPException) as e:
            return failed_status(e), b""

    def stream(self, payload: dict, chunks: int, on_first=None) -> int:
        """A streamed /generate read for `chunks` chunks (then the connection is closed) -> HTTP status (0: the
        connection failed or broke before a chunk, TIMED_OUT: no chunk in time). on_first() runs after the first
        chunk."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            conn.request("POST", "/generate", json.dumps({**payload, "stream": True}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                r.read()
                return r.status
            for i in range(chunks):
                if not r.readline():
                    break
                if i == 0 and on_first:
                    on_first()
            return 200
        except (OSError, http.client.HTTPException) as e:
            return failed_status(e)
        finally:
            conn.close()

    def gauges(self) -> dict[str, float]:
        """SGLang's /metrics gauges of IDLE_GAUGES that the server exports, each summed over ranks ({} without
        metrics)."""
        status, body = self.get("/metrics")
        if status != 200:
            return {}
        text, out = body.decode("utf-8", "replace"), {}
        for name in IDLE_GAUGES:
            values = re.findall(rf"^sglang:{name}\{{[^}}]*\}}\s+(\S+)", text, re.M)
            if values:
                out[name] = sum(float(v) for v in values)
        return out


def generate_payload(ids: list[int], new_tokens: int, greedy: bool = True, **extra) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0 if greedy else 0.8,
                                                  "ignore_eos": True}, **extra}


def probe_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """The probes' token ids: `count` prompts of 32-699 random ids, the same for a seed."""
    rng = random.Random(seed + 1)
    return [[rng.randrange(100, vocab - 1) for _ in range(rng.randrange(32, 700))] for _ in range(count)]


def probes(server: Server, prompts: list[list[int]], new_tokens: int) -> list[list[int] | str]:
    """Greedy outputs of the probe prompts, one at a time (an error string where a probe failed)."""
    out = []
    for ids in prompts:
        status, body = server.post("/generate", json.dumps(generate_payload(ids, new_tokens)).encode())
        out.append(json.loads(body)["output_ids"] if status == 200 else f"HTTP {status}")
    return out


class Load:
    """The mixed load: per request kind, the statuses seen; malformed answers without a message are kept."""

    def __init__(self, server: Server, vocab: int, seed: int, max_new_tokens: int,
                 malformed: tuple[str, ...] = tuple(MALFORMED)):
        self.server, self.vocab, self.max_new_tokens, self.malformed = server, vocab, max_new_tokens, malformed
        rng = random.Random(seed)
        self.prefixes = [[rng.randrange(100, vocab - 1) for _ in range(PREFIX_LEN)] for _ in range(PREFIXES)]
        self.statuses: dict[str, Counter] = {k: Counter() for k in WEIGHTS}
        self.unexplained: list[str] = []
        self.lock = threading.Lock()
        self.seed = seed

    def prompt(self, rng: random.Random) -> list[int]:
        tail = [rng.randrange(100, self.vocab - 1) for _ in range(rng.randrange(16, 512))]
        return self.prefixes[rng.randrange(PREFIXES)] + tail

    def one(self, rng: random.Random) -> None:
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        new = rng.randrange(8, self.max_new_tokens + 1)
        if kind == "complete":
            status, _ = self.server.post("/generate", json.dumps(generate_payload(self.prompt(rng), new,
                                                                                  greedy=rng.random() < 0.5)).encode())
        elif kind == "cut":
            status = self.server.stream(generate_payload(self.prompt(rng), new), chunks=rng.randrange(1, 6))
        elif kind == "abort":
            rid = f"soak-{self.seed}-{rng.getrandbits(48):x}"
            status = self.server.stream(generate_payload(self.prompt(rng), self.max_new_tokens, rid=rid), chunks=10**6,
                                        on_first=lambda: self.server.post("/abort_request",
                                                                          json.dumps({"rid": rid}).encode(), 30))
        else:
            name = rng.choice(self.malformed)
            payload = MALFORMED[name](self.vocab)
            status, body = self.server.post("/generate", payload if isinstance(payload, bytes)
                                            else json.dumps(payload).encode())
            if not (400 <= status < 500 and body.strip()):
                with self.lock:
                    self.unexplained.append(f"{name}: HTTP {status} {body[:200]!r}")
        with self.lock:
            self.statuses[kind][status] += 1

    def counts(self) -> dict[str, dict[str, int]]:
        """Per request kind, {HTTP status (as a JSON key): count}."""
        return {k: {str(s): n for s, n in c.items()} for k, c in self.statuses.items()}

    def run(self, clients: int, seconds: float) -> None:
        end = time.time() + seconds

        def worker(i):
            rng = random.Random(self.seed * 1000 + i)
            while time.time() < end:
                self.one(rng)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def wait_idle(server: Server, seconds: float) -> dict[str, float]:
    """The server's IDLE_GAUGES, polled until every one it exports is 0 or `seconds` pass: the last seen ({} without
    metrics)."""
    end = time.time() + seconds
    while True:
        seen = server.gauges()
        if not seen or is_idle(seen) or time.time() >= end:
            return seen


def is_idle(gauges: dict[str, float]) -> bool:
    """No request holds pool tokens, runs or waits (the pool's gauge at least exported)."""
    return "num_used_tokens" in gauges and not any(gauges.values())


def retracted_requests(log_text: str) -> int:
    """Requests the scheduler retracted for want of pool space, summed over its "#retracted_reqs: N" log lines."""
    return sum(int(n) for n in re.findall(r"#retracted_reqs: (\d+)", log_text))


def checks(result: dict, min_retractions: int = 0) -> dict[str, bool]:
    """The soak's verdicts from its result (see the module docstring)."""
    well_formed = [s for k in ("complete", "cut", "abort") for s, n in result["statuses"][k].items() if n]
    forced = {f"at least {min_retractions} requests retracted": (result["retracted_requests"] or 0) >= min_retractions}
    return {
        "no 5xx or broken connection for well-formed requests": all(200 <= int(s) < 500 or int(s) == TIMED_OUT
                                                                    for s in well_formed),
        "every well-formed request answered within the client's timeout": all(int(s) != TIMED_OUT
                                                                                for s in well_formed),
        "malformed answered 4xx with a message": result["statuses"]["malformed"] and not result["unexplained"],
        "tokens in use back to 0 when idle": result["idle_used_tokens"] == 0,
        "probes after == before": result["probes_after"] == result["probes_before"]
        and not any(isinstance(p, str) for p in result["probes_before"]),
        "server alive (/health)": result["health"] == 200,
        "no traceback in the server log": result["tracebacks"] == 0,
        **(forced if min_retractions else {}),
        **({"idle before the probes before (the warm-up's requests done)": is_idle(result["after_warmup"])}
           if "after_warmup" in result else {}),
        **({f"a measured load of at least {result['min_load_seconds']:g} s within --finish-by":
            result["seconds"] >= result["min_load_seconds"]} if "finish_by" in result else {}),
        **({"radix cache flushed before the probes after": result["flush_status"] == 200}
           if "flush_status" in result else {}),
    }


def soak(port: int, seconds: float, clients: int, vocab: int, seed: int = 0, probe_count: int = 8,
         probe_tokens: int = 16, max_new_tokens: int = 128, server_log: Path | None = None,
         idle_seconds: float = 60, malformed: tuple[str, ...] = tuple(MALFORMED), min_retractions: int = 0,
         flush_before_probes_after: bool = False, client_timeout: float = 120, warmup_seconds: float = 0,
         finish_by: float | None = None, started: float | None = None, min_load_seconds: float = 60) -> dict:
    """The soak (module docstring). `finish_by`: seconds from `started` (time.monotonic(), default now) within which
    the run is to end; the measured load is shortened to fit, and checked to be at least `min_load_seconds`."""
    started = time.monotonic() if started is None else started
    server = Server(port, client_timeout)
    prompts = probe_prompts(vocab, probe_count, seed)
    log_start = server_log.stat().st_size if server_log and server_log.exists() else 0
    result: dict = {"port": port, "seconds": seconds, "clients": clients, "vocab": vocab, "seed": seed,
                    "probe_count": probe_count, "malformed": list(malformed),
                    "client_timeout_s": client_timeout}
    if warmup_seconds:  # another seed: the measured load's prompts are not cached by it
        warmup = Load(server, vocab, seed + 7919, max_new_tokens, malformed)
        warmup.run(clients, warmup_seconds)
        result["warmup_statuses"] = warmup.counts()
        # the probes before run alone: on dummy weights a greedy token depends on the batch it decodes in, and the
        # warm-up's requests its clients gave up on are still being served
        result["after_warmup"] = wait_idle(server, client_timeout + idle_seconds)
    probes_start = time.monotonic()
    result["probes_before"] = probes(server, prompts, probe_tokens)
    if finish_by is not None:
        # what follows the load, bounded: the idle wait, the probes after (as long as the probes before took), a margin
        after = idle_seconds + (time.monotonic() - probes_start) + FINISH_MARGIN_S
        seconds = max(0.0, min(seconds, finish_by - (time.monotonic() - started) - after))
        result.update(seconds_asked=result["seconds"], seconds=round(seconds, 1), finish_by=finish_by,
                      min_load_seconds=min_load_seconds)
    load = Load(server, vocab, seed, max_new_tokens, malformed)
    t0 = time.time()
    inside = {}
    loader = threading.Thread(target=load.run, args=(clients, seconds), daemon=True)
    loader.start()
    time.sleep(min(seconds / 2, 30))  # (with no time left for a load, the probes inside run alone)
    inside["probes"] = probes(server, prompts, probe_tokens)
    loader.join()
    result["load_s"] = round(time.time() - t0, 1)
    result["statuses"] = load.counts()
    result["unexplained"] = load.unexplained[:20]
    result["probes_inside_equal"] = sum(a == b for a, b in zip(inside["probes"], result["probes_before"]))
    result["idle_used_tokens"] = wait_idle(server, idle_seconds).get("num_used_tokens")
    if flush_before_probes_after:
        result["flush_status"] = server.post("/flush_cache", b"")[0]
    result["probes_after"] = probes(server, prompts, probe_tokens)
    result["health"] = server.get("/health")[0]
    text = server_log.read_bytes()[log_start:].decode("utf-8", "replace") if server_log and server_log.exists() else ""
    result["tracebacks"] = text.count("Traceback (most recent call last)")
    result["retracted_requests"] = retracted_requests(text) if server_log else None
    result["checks"] = checks(result, min_retractions)
    return result


STATUS_NAMES = {TIMED_OUT: "timed out", 0: "broken"}


def table(result: dict) -> str:
    lines = ["| request kind | answers (HTTP status: count) |", "|---|---|"]
    for kind, statuses in result["statuses"].items():
        lines.append(f"| {kind} | " + ", ".join(f"{STATUS_NAMES.get(int(s), s)}: {n}"
                                                for s, n in sorted(statuses.items(), key=lambda x: int(x[0]))) + " |")
    retracted = result.get("retracted_requests")
    lines += ["", f"probes inside the load equal to before: {result['probes_inside_equal']} of "
                  f"{len(result['probes_before'])}; tokens in use when idle: {result['idle_used_tokens']}; requests "
                  f"retracted: {'not read (no server log)' if retracted is None else retracted}",
              "",
              "| check | verdict |", "|---|---|"]
    lines += [f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in result["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=21000)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clients", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=None, help="the model's vocabulary size (default: /get_model_info)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-log", type=Path, help="the server's log, read for tracebacks written during the soak")
    ap.add_argument("--idle-seconds", type=float, default=60,
                    help=f"the longest wait for the server's idle gauges (at least {MIN_IDLE_SECONDS}: SGLang "
                         "republishes them 30 s after its last report)")
    ap.add_argument("--warmup-seconds", type=float, default=0,
                    help="the load run this long first, unchecked (kernels a fresh host compiles at first use)")
    ap.add_argument("--client-timeout", type=float, default=120,
                    help="seconds a request waits for its answer before the client gives up (counted as timed out)")
    ap.add_argument("--start", metavar="BACKEND", help="start a server of this harness run (RUNS) for the soak")
    ap.add_argument("--model", help="with --start: the checkpoint (its weights are loaded), or a bundled config with "
                                    "--load-format dummy")
    ap.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                    help="with --start: dummy for a config without weights (configs/models/*; a block-FP8 one gets the "
                         "deployment draw, harness.server.dummy_weights_env)")
    ap.add_argument("--server-flags", default="", help="with --start: more server flags, in one string")
    ap.add_argument("--context-length", type=int, default=4096,
                    help="with --start: the server's context length (the trained checkpoint's 4 096 by default)")
    ap.add_argument("--without-out-of-range-ids", action="store_true",
                    help=f"no malformed requests of the kinds {', '.join(OUT_OF_RANGE_IDS)} (a backend without "
                         "snapmla's request checks dies of the first: sglang PR #8383)")
    ap.add_argument("--flush-before-probes-after", action="store_true",
                    help="empty the radix cache before the probes after (dummy weights: see the module docstring)")
    ap.add_argument("--min-retractions", type=int, default=0,
                    help="fail unless the server log shows at least this many retracted requests (a pool small "
                         "enough to force them)")
    ap.add_argument("--finish-by", type=float, default=None,
                    help="end the whole run (the server's start included) within this many seconds of the tool's "
                         "start: the measured load is shortened to fit")
    ap.add_argument("--min-load-seconds", type=float, default=60,
                    help="with --finish-by: fail unless the measured load left runs at least this long")
    ap.add_argument("--out", type=Path, default=Path("soak_out"))
    started = time.monotonic()
    args = ap.parse_args(argv)
    if args.idle_seconds < MIN_IDLE_SECONDS:
        ap.error(f"--idle-seconds {args.idle_seconds:g} is shorter than SGLang's 30 s window for idle gauges: an idle "
                 f"server can still report a finished prefill's pool tokens; give --idle-seconds {MIN_IDLE_SECONDS} "
                 "or more")
    args.started = started
    args.out.mkdir(parents=True, exist_ok=True)
    if args.start:
        from harness.server import RUNS, kill_servers_on_exit, serving

        kill_servers_on_exit()
        args.server_log = args.out / "server.log"
        flags = [*RUNS[args.start], "--enable-metrics", *shlex.split(args.server_flags)]
        with serving(args.model, args.port, flags, args.server_log, 900, load_format=args.load_format,
                     context_length=args.context_length):
            result = run_soak(args)
    else:
        result = run_soak(args)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0 if all(result["checks"].values()) else 1


def run_soak(args) -> dict:
    vocab = args.vocab or model_vocab(Server(args.port)) or VOCAB_FALLBACK
    return soak(args.port, args.seconds, args.clients, vocab, args.seed, max_new_tokens=args.max_new_tokens,
                server_log=args.server_log, idle_seconds=args.idle_seconds,
                malformed=malformed_kinds(args.without_out_of_range_ids), min_retractions=args.min_retractions,
                flush_before_probes_after=args.flush_before_probes_after, client_timeout=args.client_timeout,
                warmup_seconds=args.warmup_seconds, finish_by=args.finish_by,
                started=getattr(args, "started", None), min_load_seconds=args.min_load_seconds)


def malformed_kinds(without_out_of_range_ids: bool) -> tuple[str, ...]:
    """The MALFORMED kinds a soak sends: all, or all but OUT_OF_RANGE_IDS."""
    return tuple(k for k in MALFORMED if not (without_out_of_range_ids and k in OUT_OF_RANGE_IDS))


def model_vocab(server: Server) -> int | None:
    """The served model's vocabulary size from /get_model_info (SGLang reports it as `vocab_size` where it does)."""
    status, body = server.get("/get_model_info")
    try:
        return int(json.loads(body)["vocab_size"]) if status == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
