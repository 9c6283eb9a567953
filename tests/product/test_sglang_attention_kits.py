"""SGLang 0.5.17's own attention test kits (`sglang.test.kits.attention_unittest`) against `--attention-backend snapmla`.

The kits build a one-layer absorbed-MLA model over a mock ModelRunner, write its keys through the pool, run the backend
the way SGLang's runners do (eager; decode CUDA-graph capture with the backend's fill value then padded replay; EAGLE
target verify, eager and graphed; draft extend v2 graphed) and compare with their own fp32 attention of the BF16 keys.
SnapMLA's pool replaces the kit's MLATokenToKVPool (same constructor), with DeepSeek's dimensions (latent 512, RoPE
64) and 64-token pages. The kits' BF16 tolerance becomes SGLang's FP8-cache tolerance (its DSA FP8 cases: 0.2 / 0.2);
`test_the_fp8_tolerance_still_rejects_a_wrong_decode` shows what it still rejects.

CPU machines run the eager kits: the Triton kernels in the interpreter, stand-ins for FlashInfer's wrappers (built by
FlashMLABackend.__init__ and planned for every extend batch, used only by MHA prefill) and for sgl_kernel's FlashMLA
metadata. The graph runners need the
GPU (FlashMLABackend allocates its graph buffers on "cuda"); they drive SGLang's capture / replay metadata protocol
but never capture a graph (tests/product/test_gpu_graph_protocol.py does).
"""

from __future__ import annotations

import unittest

import pytest
import torch

from sglang_graph_protocol import import_flashmla_backend, install_stand_in
from sglang_snapmla import numerics as nx

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# SGLang's tolerance for an FP8 KV cache against the BF16 reference (kits' dsa_attention.DSA_SPARSE_FP8_ATOL/RTOL)
FP8_ATOL = FP8_RTOL = 0.2
HIDDEN = 128
MAX_CONTEXT = 4160 if ON_GPU else 448
DIMS = dict(kv_lora_rank=nx.KV_LORA_RANK, qk_rope_head_dim=nx.ROPE_DIM, hidden_size=HIDDEN,
            max_context_len=MAX_CONTEXT, dtype=torch.bfloat16, device=DEVICE)
# decode prefixes around page edges and over many pages (the interpreter on CPU runs the short ones)
DECODE_PREFIXES = (1, 63, 64, 65, 127, 300) + ((1000, 4097 - 1) if ON_GPU else ())
# capture batches that give several splits and one (the H100 heuristic picks one split from batch ~67 at 16 heads and
# ~34 at 128 heads)
GRAPH_CAPTURE_BATCHES = {16: (8, 80), 128: (8, 40)}


class _StandInFlashInferWrapper:
    """FlashInfer's prefill / MLA wrapper on a machine without FlashInfer's kernels: constructible (FlashMLABackend
    builds them) and plannable (the prefill metadata SGLang builds for every extend batch plans them), unusable (MHA
    prefill runs on the GPU only)."""

    def __init__(self, *args, **kwargs):
        pass

    def plan(self, *args, **kwargs):
        pass

    begin_forward = plan

    def __getattr__(self, name):
        raise RuntimeError(f"FlashInfer is not available on this machine ({name})")


class _TorchWithoutPinnedMemory:
    """`torch` as FlashInfer-MLA's backend module sees it on a machine without a CUDA driver: its __init__ pins small
    host buffers (SGLang 0.5.18 on), which needs the driver; the same buffers unpinned."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, pin_memory=False, **kwargs):
        return torch.zeros(*args, **kwargs)

    @staticmethod
    def empty(*args, pin_memory=False, **kwargs):
        return torch.empty(*args, **kwargs)


class _Case(unittest.TestCase):
    __test__ = False  # not a test itself

    def runTest(self):  # the kits take a unittest.TestCase for skipTest
        pass


@pytest.fixture
def kits(monkeypatch):
    """The kit modules with SnapMLA's pool and SGLang's FP8 tolerance in place."""
    import_flashmla_backend()
    # the runner modules import every attention method of the kits, two of which need these at import
    install_stand_in("sgl_kernel", merge_state_v2=None)
    install_stand_in("sgl_kernel.sparse_flash_attn", convert_vertical_slash_indexes=None,
                     convert_vertical_slash_indexes_mergehead=None, sparse_attn_func=None)
    from sglang.srt.layers.attention import flashinfer_mla_backend

    for name in ("BatchPrefillWithRaggedKVCacheWrapper", "BatchMLAPagedAttentionWrapper"):
        if not hasattr(flashinfer_mla_backend, name):
            monkeypatch.setattr(flashinfer_mla_backend, name, _StandInFlashInferWrapper, raising=False)
    if not ON_GPU:
        monkeypatch.setattr(flashinfer_mla_backend, "torch", _TorchWithoutPinnedMemory())
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention
    from sglang.test.kits.attention_unittest.runner_modes import (
        cuda_graph_decode_runner,
        speculative_draft_extend_runner,
        speculative_target_verify_runner,
    )

    from sglang_snapmla import plugin
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    plugin.register()
    monkeypatch.setattr(mla_attention, "MLATokenToKVPool", SnapMLATokenToKVPool)
    modules = (mla_attention, cuda_graph_decode_runner, speculative_target_verify_runner,
               speculative_draft_extend_runner)
    for module in modules:
        if hasattr(module, "MLA_ATOL"):
            monkeypatch.setattr(module, "MLA_ATOL", FP8_ATOL)
            monkeypatch.setattr(module, "MLA_RTOL", FP8_RTOL)
    return dict(mla=mla_attention, graph=cuda_graph_decode_runner, verify=speculative_target_verify_runner,
                draft_extend=speculative_draft_extend_runner)


def _case(kits, mode: str, heads: int, prefix_lens, extend_lens=()):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return kits["mla"].MLAAttentionCase(name=f"snapmla_{mode.lower()}_h{heads}", backend="snapmla",
                                        forward_mode=getattr(ForwardMode, mode), num_heads=heads,
                                        page_size=nx.PAGE_SIZE, prefix_lens=tuple(prefix_lens),
                                        extend_lens=tuple(extend_lens))


@pytest.mark.parametrize("heads", [16, 128])
def test_decode_eager(kits, heads):
    kits["mla"].run_mla_attention_case(_Case(), _case(kits, "DECODE", heads, DECODE_PREFIXES), atol=FP8_ATOL,
                                       rtol=FP8_RTOL, **DIMS)


@pytest.mark.parametrize("bug", ["pages of another request", "last key dropped"])
def test_the_fp8_tolerance_still_rejects_a_wrong_decode(kits, monkeypatch, bug):
    """SGLang's FP8 tolerance is loose elementwise; a decode that reads another request's pages, or misses the newest
    key, still fails the kit."""
    from sglang_snapmla import ops

    decode = ops.decode_planned  # what every layer of a planned step runs

    def wrong_decode(q, q_scale, q_rope, content, scale, rope, block_table, seq_lens, *args, **kwargs):
        if bug == "pages of another request":
            block_table = block_table.roll(1, 0)
        else:
            seq_lens = seq_lens - 1
        return decode(q, q_scale, q_rope, content, scale, rope, block_table, seq_lens, *args, **kwargs)

    monkeypatch.setattr(ops, "decode_planned", wrong_decode)
    with pytest.raises(AssertionError, match="not close"):
        kits["mla"].run_mla_attention_case(_Case(), _case(kits, "DECODE", 16, DECODE_PREFIXES), atol=FP8_ATOL,
                                           rtol=FP8_RTOL, **DIMS)


def test_a_runner_without_the_snapmla_pool_is_refused_by_the_backend(kits, monkeypatch):
    """A model runner whose KV pool is SGLang's own 576-wide one (the plugin's pool hook did not run in that process)
    gets no backend: its construction names the missing plugin instead of decoding SGLang's bytes as SnapMLA's."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    monkeypatch.setattr(kits["mla"], "MLATokenToKVPool", MLATokenToKVPool)
    with pytest.raises(RuntimeError, match="needs its KV pool, but this process built MLATokenToKVPool"):
        kits["mla"].run_mla_attention_case(_Case(), _case(kits, "DECODE", 16, (1, 63)), atol=FP8_ATOL,
                                           rtol=FP8_RTOL, **DIMS)


@pytest.mark.parametrize("heads", [16, pytest.param(128, marks=pytest.mark.gpu)])  # 128: minutes in the interpreter
def test_absorbed_extend_eager(kits, heads, monkeypatch):
    """Prefill through the absorbed MQA layer (the kit passes q as latent + RoPE concatenated, no k): new spans over
    page edges after prefixes of 0 to several pages, planned by SGLang's own forward-metadata call for the batch (a
    layer planning the step again would fail here)."""
    from sglang_snapmla import backend

    def replanned():
        raise AssertionError("the layer's batch did not match the plan of SGLang's forward-metadata call")

    monkeypatch.setattr(backend, "_log_extend_replanned", replanned)
    prefixes, spans = (0, 0, 8, 63, 64, 130), (1, 65, 56, 2, 64, 70)
    kits["mla"].run_mla_attention_case(_Case(), _case(kits, "EXTEND", heads, prefixes, spans), atol=FP8_ATOL,
                                       rtol=FP8_RTOL, **DIMS)


@pytest.mark.gpu  # FlashMLABackend.init_cuda_graph_state allocates on "cuda"
@pytest.mark.parametrize("heads", [16, 128])
def test_decode_cuda_graph_capture_and_padded_replay(kits, heads):
    for capture_bs in GRAPH_CAPTURE_BATCHES[heads]:
        prefixes = (DECODE_PREFIXES * capture_bs)[: capture_bs - 1]  # one padded row
        kits["graph"].run_mla_cuda_graph_decode_case(_Case(), _case(kits, "DECODE", heads, prefixes),
                                                     cuda_graph_capture_batch_size=capture_bs, **DIMS)


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("graphed", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["eager", "graph"])
def test_eagle_target_verify(kits, heads, graphed):
    window = 3
    # prefixes of 1 and 2 tokens: a verify window one key short there changes the output at any head count (with
    # only long prefixes the missing key hid inside the kit's tolerance at 128 heads)
    prefixes = (1, 2, 62, 63, 64, 200)
    case = _case(kits, "TARGET_VERIFY", heads, prefixes, (window,) * len(prefixes))
    if graphed:
        kits["verify"].run_mla_eagle_verify_cuda_graph_case(_Case(), case, topk=1, cuda_graph_capture_batch_size=6,
                                                            **DIMS)
    else:
        kits["verify"].run_mla_eagle_verify_case(_Case(), case, topk=1, **DIMS)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_draft_extend_v2_cuda_graph(kits, heads):
    window = 3
    prefixes = (61, 64, 130)
    case = _case(kits, "DRAFT_EXTEND_V2", heads, prefixes, (window,) * len(prefixes))
    kits["draft_extend"].run_mla_draft_extend_v2_cuda_graph_case(_Case(), case, cuda_graph_capture_batch_size=4,
                                                                  **DIMS)
