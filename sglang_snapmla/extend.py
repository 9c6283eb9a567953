"""Prefill over a cached prefix (extend): which of the two routes a batch takes, and the absorbed route's launches.

An extend batch holds, per request i, e_i new tokens after a cached prefix of p_i tokens (t_i = p_i + e_i). Two
routes read the FP8 cache for it:

* **MHA** (SGLang's one-shot or chunked-prefix forward): fetch-dequant of the p_i + e_i rows to BF16, kv_b_proj
  up-projects every one of them to H heads of K and V (a prefix shared by k requests is up-projected k times), then
  FlashInfer's ragged prefill at head dims 192 / 128. Its cost grows with the prefix rows: p_i x H x 2 x 512 x 256
  FLOP of up-projection per request.
* **absorbed MLA**: the new tokens are the decode kernel's query rows (s_q per request, causal among them) over the
  paged FP8 cache: nothing is up-projected, QK and PV run in FP8 at 576 / 512 dims. Its cost grows with new x total
  tokens: e_i x t_i x H x 2 x (576 + 512) FLOP (a row tile reads every page of its request).

Absorbed wins where few new tokens meet a long prefix (a shared system prompt, the next turn of a conversation);
MHA wins for long new spans (a fresh prompt, chunked prefill of a long document). `prefers_absorbed` compares the
two with the per-unit times of `ROUTE_COSTS` (fitted on an H100); SNAPMLA_EXTEND_ROUTE=mha|absorbed pins a route
(measurements).

SGLang itself sends every prefill batch of up to 2 048 tokens (its breakable prefill CUDA graph, attention run
eagerly between graph segments) to absorbed MLA whatever the route says; `plan_absorbed_launches` turns such a batch
into a few decode launches: requests of similar new-span length share one launch, each request's tokens at the end
of its s_q window (left-padded), so that window position j of request i sees keys [0, t_i - s_q + j] -- exactly its
causal range. Padding positions see shorter (or empty) ranges; their outputs are computed and dropped.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from .block_fp8 import block_fp8_quantization
from .errors import SnapMLAInputError
from .layout import PAGE_SIZE
from .settings import requested_extend_route

logger = logging.getLogger(__name__)

# A request joins the current launch while its new span fills at least this share of the launch's longest one:
# padding stays under 1 / 0.75 - 1 = 33 % of a launch's query rows.
LAUNCH_FILL = 0.75
# Query rows (padded tokens x heads) above which a batch outside captured prefill stays on MHA: the absorbed route
# holds ~4 KB of transient buffers per row (Q gathered and quantized, the output before and after its scatter); 2^20
# rows is an 8 192-token prefill chunk (SGLang's default on an H100) at 128 heads, ~4 GB, less than the MHA route of
# such a batch over long prefixes allocates (K and V of every prefix token at every head, 896 B per token and head).
ABSORBED_MAX_ROWS = 1 << 20


@dataclass(frozen=True)
class RouteCosts:
    """Per-unit times (s) of the two routes on an H100, fitted to benchmarks/bench_extend_routes.py:
    absorbed_pair: one (query row = token x head, key) of the absorbed extend (Q gather and quant, the FP8 decode
    kernel, the scatter), 2 x (576 + 512) FLOP; mha_upproj: one (cached token, head) of the MHA route's prefix work
    (fetch-dequant, kv_b_proj's 2 x 512 x 256 FLOP, K assembly); mha_pair: one (query row, key) of FlashInfer's ragged
    prefill, 2 x (192 + 128) FLOP; *_fixed: per batch and layer."""
    absorbed_pair: float
    absorbed_fixed: float
    mha_upproj: float
    mha_pair: float
    mha_fixed: float


# Fitted (least squares on relative error) to the route benchmark's 20 cases at 16 and 128 heads on an H100 80GB
# HBM3: 644 TFLOP/s effective for the absorbed pairs, 266 for the prefix up-projection with its memory traffic, 690 for
# the ragged prefill's pairs; the faster measured route is the cheaper modelled one in all 20 (docs/BENCHMARKS.md).
# `benchmarks.bench_extend_routes.fit_route_costs` gives these from results/bench/extend_routes_h100.json; the MHA
# route's up-projection is the BF16 kv_b_proj of a BF16 checkpoint. With an FP8 checkpoint's W8A8 kv_b_proj
# (`--kv-b-proj fp8`, H200: results/bench/extend_routes_fp8_h200.json) these costs still pick the faster measured
# route in all 20 cases; that run's own fit differs most in mha_upproj (1.11e-9, 13 % above), so one model serves both.
ROUTE_COSTS = RouteCosts(absorbed_pair=3.38e-12, absorbed_fixed=2.7e-4, mha_upproj=9.86e-10, mha_pair=9.27e-13,
                         mha_fixed=3.1e-4)


def group_requests(extend_lens: list[int]) -> list[list[int]]:
    """Requests with new tokens (indices into extend_lens), grouped into launches: sorted by new-span length,
    longest first; a request joins the current group while its span is >= LAUNCH_FILL x the group's longest."""
    order = sorted((i for i, e in enumerate(extend_lens) if e > 0), key=lambda i: -extend_lens[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and extend_lens[i] >= LAUNCH_FILL * extend_lens[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def route_units(prefix_lens: list[int], extend_lens: list[int], heads: int,
                groups: list[list[int]] | None = None) -> tuple[tuple[float, float], tuple[float, float, float]]:
    """The work each route's modelled time is linear in, per RouteCosts field: absorbed (batches, query-row x key
    pairs over the padded launches), MHA (batches, cached token x head up-projections, query-row x key pairs of the
    causal prefill). `groups`: `group_requests(extend_lens)`, where the caller has it."""
    pairs = sum(len(group) * extend_lens[group[0]] * max(prefix_lens[i] + extend_lens[i] for i in group) * heads
                for group in (groups if groups is not None else group_requests(extend_lens)))
    upproj = sum(prefix_lens) * heads
    mha_pairs = sum(e * (p + (e + 1) / 2) * heads for p, e in zip(prefix_lens, extend_lens))
    return (1.0, pairs), (1.0, upproj, mha_pairs)


def route_costs(prefix_lens: list[int], extend_lens: list[int], heads: int, costs: RouteCosts = ROUTE_COSTS,
                groups: list[list[int]] | None = None) -> tuple[float, float]:
    """(absorbed, MHA) predicted attention-side seconds of an extend batch (the new tokens' own projections are
    the same on both routes and left out): `route_units` times the per-unit times."""
    (a_batches, a_pairs), (m_batches, upproj, m_pairs) = route_units(prefix_lens, extend_lens, heads, groups)
    return (a_batches * costs.absorbed_fixed + a_pairs * costs.absorbed_pair,
            m_batches * costs.mha_fixed + upproj * costs.mha_upproj + m_pairs * costs.mha_pair)


def padded_rows(extend_lens: list[int], heads: int, groups: list[list[int]] | None = None) -> int:
    """Query rows the absorbed route launches for a batch (left-padded windows included)."""
    groups = groups if groups is not None else group_requests(extend_lens)
    return sum(len(g) * extend_lens[g[0]] for g in groups) * heads


def prefers_absorbed(prefix_lens: list[int] | None, extend_lens: list[int] | None, heads: int) -> bool:
    """Whether an extend batch outside captured prefill should take absorbed MLA rather than MHA prefill: never
    without a cached prefix or above ABSORBED_MAX_ROWS, else the cheaper route under ROUTE_COSTS (or the route
    SNAPMLA_EXTEND_ROUTE pins)."""
    route = requested_extend_route()
    if route == "mha" or not prefix_lens or not extend_lens or not any(prefix_lens):
        return False
    groups = group_requests(extend_lens)
    if padded_rows(extend_lens, heads, groups) > ABSORBED_MAX_ROWS:
        return False
    if route == "absorbed":
        return True
    absorbed, mha = route_costs(prefix_lens, extend_lens, heads, groups=groups)
    return absorbed < mha


@dataclass
class AbsorbedLaunch:
    """One decode launch of an absorbed extend: B requests, s_q query tokens each (left-padded windows).
    rows [B * s_q] int64: the batch's token row feeding each window position; src / dst [N] int64: window position
    and batch row of each of the N real tokens; block_table [B, max_pages] int32; seq_lens [B] int32."""
    s_q: int
    max_pages: int
    rows: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor


def plan_absorbed_launches(extend_lens: list[int], seq_lens: list[int], req_pool_indices: torch.Tensor,
                           req_to_token: torch.Tensor) -> list[AbsorbedLaunch]:
    """The launches of an absorbed extend (`group_requests`). Tokens of request i are rows [start_i, start_i + e_i)
    of the batch (SGLang's extend layout); req_to_token [R, max_context] holds each request's slots (page-aligned,
    page size 64). Index tensors are built on the host and copied once per batch; the block tables are gathered on
    the device."""
    device = req_pool_indices.device
    starts = [0]
    for e in extend_lens[:-1]:
        starts.append(starts[-1] + e)
    launches = []
    for group in group_requests(extend_lens):
        s_q = extend_lens[group[0]]
        rows, src, dst = [], [], []
        for b, i in enumerate(group):
            pad = s_q - extend_lens[i]
            # padding positions read the request's first token (any real row would do: their outputs are dropped)
            rows += [starts[i]] * pad + list(range(starts[i], starts[i] + extend_lens[i]))
            src += range(b * s_q + pad, (b + 1) * s_q)
            dst += range(starts[i], starts[i] + extend_lens[i])
        lens = [seq_lens[i] for i in group]
        max_pages = -(-max(lens) // PAGE_SIZE)
        members = torch.tensor(group, dtype=torch.int64).to(device, non_blocking=True)
        columns = torch.arange(0, max_pages * PAGE_SIZE, PAGE_SIZE, device=device)
        table = req_to_token[req_pool_indices.index_select(0, members)[:, None], columns[None, :]]
        launches.append(AbsorbedLaunch(
            s_q=s_q, max_pages=max_pages, rows=_index(rows, device), src=_index(src, device), dst=_index(dst, device),
            block_table=(table // PAGE_SIZE).to(torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32).to(device, non_blocking=True)))
    return launches


def _index(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


# -- the MHA route's up-projection on block-FP8 weights ----------------------------------------------------------------
# SGLang's MHA prefill up-projects a chunk of cached tokens in one kv_b_proj call, up to SGLANG_MAX_KV_CHUNK_CAPACITY
# tokens (128 Ki by default in 0.5.17 and 0.5.23) into K_nope | V of every local head: [tokens, heads x 256]. On a
# block-FP8 checkpoint whose GEMMs run on SGLang's Triton W8A8 kernel (DeepGEMM off) that kernel addresses its output
# with 32-bit offsets (row x N), so one call of 2^31 or more output elements writes outside it: at 128 heads (DP
# attention) any chunk above 65 535 tokens -- a CUDA illegal-address error, which the process does not survive. (An
# H200 run of `benchmarks/bench_extend_routes.py --kv-b-proj fp8` faulted on its first 128-head case, 66 048 rows,
# after its ten 16-head cases of up to 66 048 rows ran.) The bound applies whatever GEMM runs kv_b_proj: at 128 heads
# it costs one more chunk for prefixes above 64 Ki tokens.
MHA_CHUNK_ENV = "SGLANG_MAX_KV_CHUNK_CAPACITY"
SGLANG_MHA_CHUNK_DEFAULT = 128 * 1024
GEMM_OUTPUT_LIMIT = 2**31  # elements one call of the Triton block-FP8 GEMM can address


def mha_chunk_capacity(heads: int) -> int:
    """The most cached tokens (whole pages) one MHA up-projection of `heads` local heads may take on block-FP8
    weights: its [tokens, heads x 256] output stays below GEMM_OUTPUT_LIMIT elements."""
    return (GEMM_OUTPUT_LIMIT - 1) // (heads * 256) // PAGE_SIZE * PAGE_SIZE


def block_fp8_weights(hf_config) -> bool:
    """Whether SGLang's model config says block-FP8 weights, as DeepSeek-V3/R1, Kimi-K2 and LongCat-Flash-FP8 ship."""
    return block_fp8_quantization(getattr(hf_config, "quantization_config", None))


def bound_mha_chunk_capacity(hf_config, heads: int, environ=os.environ) -> int | None:
    """On block-FP8 weights, keep SGLang's MHA chunk capacity within `mha_chunk_capacity(heads)`: unset, it is set
    there where SGLang's default is above it (logged); set above it by the user, the server is refused with the fix.
    -> the capacity in force where it was bounded or checked, None for other weights. Runs where the backend is built,
    in the process whose prefill reads the variable."""
    if not block_fp8_weights(hf_config):
        return None
    cap = mha_chunk_capacity(heads)
    value = environ.get(MHA_CHUNK_ENV)
    if value is None:
        if SGLANG_MHA_CHUNK_DEFAULT > cap:
            environ[MHA_CHUNK_ENV] = str(cap)
            logger.warning(f"snapmla: {MHA_CHUNK_ENV}={cap} (SGLang's default {SGLANG_MHA_CHUNK_DEFAULT}): with "
                           f"block-FP8 weights at {heads} heads a larger MHA prefill chunk makes kv_b_proj's output "
                           f"reach 2^31 elements, past what SGLang's Triton FP8 GEMM addresses")
            return cap
        return SGLANG_MHA_CHUNK_DEFAULT
    if int(value) > cap:
        raise SnapMLAInputError(
            f"{MHA_CHUNK_ENV}={value} is above {cap} tokens, the most one MHA prefill chunk may up-project with "
            f"block-FP8 weights at {heads} heads per GPU ({heads} x 256 x tokens must stay below 2^31 elements for "
            f"SGLang's Triton FP8 GEMM): set {MHA_CHUNK_ENV}={cap} or lower, or leave it unset")
    return int(value)
