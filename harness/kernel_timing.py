"""Kernel timing for benchmarks and kernel-development tools: CUDA-graph replay timing and the decode problem they time.

Not part of the shipped package (python -m from the repository root).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from sglang_snapmla import ops
from sglang_snapmla.layout import KV_LORA_RANK, PAGE_SIZE, ROPE_DIM

PAGE = PAGE_SIZE  # the name benchmarks and tools import
L2_ROTATE_BYTES = 256 << 20


def host_us(fn, calls: int, warmup: int, issue_only: bool = False) -> float:
    """Microseconds per call of `fn` launched back to back after `warmup` calls and a synchronization. issue_only:
    the host's time to issue them, timed before the synchronization (the GPU's queue absorbs the calls); otherwise
    timed through it, the larger of host and GPU time per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return (issued if issue_only else time.perf_counter() - start) / calls * 1e6


def capture_graph(fns) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of the zero-arg callables `fns` in order, captured on a side stream (as SGLang captures its decode
    graphs), the current stream ordered after it. The callers warm the calls up first."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(s)
    return g


def time_graph(make_call, copies: int, calls_per_graph: int = 20, replays: int = 15) -> float:
    """Median microseconds per call. make_call(i) -> zero-arg callable on copy i."""
    fns = [make_call(i % copies) for i in range(calls_per_graph)]
    for f in fns[:copies]:
        f()  # warm-up / compile
    torch.cuda.synchronize()
    g = capture_graph(fns)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls_per_graph)
    return statistics.median(times)


def make_inputs(b, sk, h, s_q, copies, dev):
    """Per copy: bf16 latent pool [pages*64, 576] with a shuffled page table; SnapMLA pool from it. (Timing inputs:
    every copy on the device, for L2 rotation; harness.problems builds the problems that are checked.)"""
    pages = math.ceil(sk / PAGE)
    dim = KV_LORA_RANK + ROPE_DIM
    out = []
    for _ in range(copies):
        n = b * pages
        ckv = torch.randn(n * PAGE, dim, device=dev, dtype=torch.bfloat16)
        bt = torch.randperm(n, device=dev, dtype=torch.int32).view(b, pages)
        q = torch.randn(b, s_q, h, dim, device=dev, dtype=torch.bfloat16)
        kv8, ks, kr = ops.pool_from_rows(ckv[:, :KV_LORA_RANK], ckv[:, KV_LORA_RANK:])
        out.append(dict(ckv=ckv, bt=bt, q=q, kv8=kv8, ks=ks, kr=kr))
    return out
