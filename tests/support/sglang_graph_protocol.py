"""SGLang 0.5.17's CUDA-graph protocol around the SnapMLA backend, for decode, target verify and draft extend.

SGLang's decode / speculative graph runners capture with every sequence length set to the backend's
`get_cuda_graph_seq_len_fill_value()` (1 for FlashMLA) and request-pool indices reset to 0, call
`init_forward_metadata_out_graph(fb, in_capture=True)` eagerly, and record the forward. FlashMLA's metadata code then
hands the forward `cuda_graph_kv_indices[:bs, :1]`, a width-1 view of its full-stride block table. At every replay
the runner copies the real lengths and indices into the same static buffers, calls `init_forward_metadata_out_graph`
again (which refills the table's storage), and replays: every scalar a kernel received at capture stays frozen.

`GraphProtocol` builds a SnapMLA backend over a pool of stale, non-finite bytes (reused pages), writes a batch's
keys through the pool, and runs that protocol with SGLang's own FlashMLABackend metadata code:
* on a GPU, `graphed` captures a real CUDA graph and replays it;
* on CPU (no graphs), `launches_at_capture_and_replay` records every kernel launch of the capture-time forward and of
  a forward with the replay metadata (the sm_90a kernel through a stand-in extension), so a test can check that no
  launch argument depends on what capture and replay set differently.
The backend object is built without FlashMLABackend.__init__ (which needs a ModelRunner): the fields that __init__
and our own set, and that the metadata and forward code read, are set here by name.
"""

from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace

import torch

from helpers import poison_unwritten
from sglang_snapmla import numerics as nx

MODES = ("decode", "target_verify", "draft_extend")
QK_NOPE_DIM = 128  # DeepSeek-V3's non-RoPE query width per head, before the absorbed BMM


def zeros_in_layout(t: torch.Tensor) -> torch.Tensor:
    """Zeros with `t`'s strides and offset (a graph's static input: capture and replay see one layout)."""
    storage = torch.zeros(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=t.device)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def install_stand_in(module: str, **functions) -> None:
    """On machines without sgl_kernel's CUDA build: give `module` (sgl_kernel or one of its submodules) the
    `functions` it lacks, creating it if it does not import (ImportError; OSError where it loads a CUDA library,
    which needs libcuda). A function given as None raises when called."""
    try:
        stub = __import__(module, fromlist=["_"])
    except (ImportError, OSError):
        stub = types.ModuleType(module)
        stub.__path__ = []  # a package, so that its submodules can be stand-ins too
        sys.modules[module] = stub
        if "." in module:
            parent, name = module.rsplit(".", 1)
            install_stand_in(parent)
            setattr(sys.modules[parent], name, stub)
    for name, fn in functions.items():
        if hasattr(stub, name):
            continue
        if fn is None:
            def fn(*args, _name=f"{module}.{name}", **kwargs):
                raise RuntimeError(f"{_name} is not available on this machine")
        setattr(stub, name, fn)


def import_flashmla_backend():
    """SGLang's flashmla_backend module. Without sgl_kernel's CUDA build (CPU machines) stand-ins for
    `sgl_kernel.flash_mla` (0.5.17) and SGLang's `flash_mla_interface` (0.5.23) are installed first: its `get_mla_metadata` returns FlashMLA's tile-scheduler metadata
    shapes filled with zeros (SnapMLA's kernels never read them)."""
    def get_mla_metadata(seq_lens, heads, kv_heads, is_fp8_kvcache=False):
        return (torch.zeros(4, 8, dtype=torch.int32, device=seq_lens.device),
                torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device))

    install_stand_in("sgl_kernel.flash_mla", get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=None)
    # SGLang 0.5.23 calls FlashMLA through its own interface module over the flash_mla wheel (which needs libcuda)
    install_stand_in("sglang.kernels.ops.attention.flash_mla_interface", get_mla_metadata=get_mla_metadata,
                     flash_mla_with_kvcache=None)
    from sglang.srt.layers.attention import flashmla_backend

    return flashmla_backend


class GraphProtocol:
    def __init__(self, heads: int, max_bs: int, lens: list[int], gen: torch.Generator, device: str,
                 window: int = 3, max_context_len: int = 4096):
        from sglang_snapmla import plugin
        from sglang_snapmla.backend import backend_class
        from sglang_snapmla.pool import SnapMLATokenToKVPool

        plugin.register()
        import_flashmla_backend()
        self.device, self.heads, self.window, self.gen = device, heads, window, gen
        self.lens = list(lens)
        self.bs = len(lens)
        assert self.bs <= max_bs and max(lens) + window <= max_context_len
        pages_per_req = math.ceil(max_context_len / nx.PAGE_SIZE)
        num_pages = max_bs * pages_per_req + 2
        pool = SnapMLATokenToKVPool(size=num_pages * nx.PAGE_SIZE, page_size=nx.PAGE_SIZE, dtype=torch.bfloat16,
                                    kv_lora_rank=nx.KV_LORA_RANK, qk_rope_head_dim=nx.ROPE_DIM, layer_num=1,
                                    device=device, enable_memory_saver=False)
        be = object.__new__(backend_class())
        # FlashMLABackend.__init__'s fields that its metadata code reads, and SnapMLABackend's own
        be.device, be.num_q_heads, be.num_local_heads, be.is_fp8_kvcache = torch.device(device), heads, heads, False
        be.num_draft_tokens, be.max_context_len, be.token_to_kv_pool = window, max_context_len, pool
        be.is_draft_runner, be.skip_prefill, be.forward_metadata = False, True, None
        be._eager_kv_indices_buf = None
        # SGLang 0.5.22 on: the page table can come from KV location plans; untranslated reads take the
        # req_to_token path every release has (a translated one is refused at startup)
        be.kv_index_translator, be.page_size, be.dcp_world_size, be._verify_mask = \
            SimpleNamespace(reads_are_translated=False), nx.PAGE_SIZE, 1, None
        be.cuda_graph_mla_metadata_view = be.cuda_graph_num_splits_view = None
        be.max_pages = math.ceil(max_context_len / nx.PAGE_SIZE) + 1
        # request-pool row r + 1 holds request r (row 0: where capture and padded rows point)
        be.req_to_token = torch.zeros(max_bs + 1, max_context_len, dtype=torch.int32, device=device)
        if device == "cuda":
            be.init_cuda_graph_state(max_bs, max_bs * window)
        else:  # the same buffers as SnapMLABackend.init_cuda_graph_state (FlashMLA's allocates on "cuda" by name)
            be.cuda_graph_kv_indices = torch.full((max_bs, (max_context_len + nx.PAGE_SIZE) // nx.PAGE_SIZE), 1,
                                                  dtype=torch.int32)
            be.cuda_graph_mla_metadata = torch.empty(8, 8, dtype=torch.int32)
            be.cuda_graph_num_splits = torch.empty(max_bs + 1, dtype=torch.int32)
            be.cuda_graph_draft_extend_seq_lens_k = torch.ones(max_bs, dtype=torch.int32)
            be.snapmla_graph_seq_lens = torch.ones(max_bs, dtype=torch.int32)
            be.graph_step_plans = {}
        self.backend, self.pool, self.max_bs = be, pool, max_bs
        self.layer = SimpleNamespace(layer_id=0, tp_q_head_num=heads, scaling=(nx.KV_LORA_RANK + nx.ROPE_DIM) ** -0.5)
        self._write_batch(num_pages, pages_per_req)
        # the runner's static input buffers
        self.seq_lens_buf = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.seq_lens_cpu_buf = torch.ones(max_bs, dtype=torch.int64)
        self.req_pool_buf = torch.zeros(max_bs, dtype=torch.int64, device=device)

    def _write_batch(self, num_pages, pages_per_req):
        """Every slot starts stale (a reused pool); request r's first lens[r] + window keys are written."""
        kv = self.pool.snapmla_buffers(0)
        everything = torch.zeros(1, 1, dtype=torch.int32, device=self.device)
        poison_unwritten(*kv, everything, torch.zeros(1, dtype=torch.int32), self.gen)
        pages = (torch.randperm(num_pages - 1, generator=self.gen)[: self.bs * pages_per_req] + 1).view(self.bs, -1)
        self.block_tables = pages.to(torch.int32)
        for r, n in enumerate(self.lens):
            total = n + self.window  # target verify / draft extend read the window's keys too
            slots = nx.gather_sequence(pages[r], total)
            self.backend.req_to_token[r + 1, :total] = slots.to(torch.int32).to(self.device)
            nope = torch.randn(total, 1, nx.KV_LORA_RANK, generator=self.gen).to(torch.bfloat16)
            rope = torch.randn(total, 1, nx.ROPE_DIM, generator=self.gen).to(torch.bfloat16)
            if self.device == "cuda":
                self.pool.set_mla_kv_buffer(self.layer, slots.cuda(), nope.cuda(), rope.cuda())
            else:  # the spec's quantization, what the K-append writes (tests/product/test_kernels.py), without the interpreter
                cache = nx.quantize_kv(nope[:, 0], rope[:, 0])
                for array, rows in zip(kv, (cache.content, cache.scale, cache.rope)):
                    array[slots] = rows

    # ---- one forward, as the runner calls it ------------------------------------------------------------------
    def s_q(self, mode: str) -> int:
        return 1 if mode == "decode" else self.window

    def kv_lens(self, mode: str) -> list[int]:
        """Keys each request attends to in `mode` (the kernels' seq_lens)."""
        return self.lens if mode == "decode" else [n + self.window for n in self.lens]

    def _forward_batch(self, mode, seq_lens, seq_lens_cpu, req_pool_indices):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        fm = {"decode": ForwardMode.DECODE, "target_verify": ForwardMode.TARGET_VERIFY,
              "draft_extend": ForwardMode.DRAFT_EXTEND_V2}[mode]
        fb = SimpleNamespace(forward_mode=fm, batch_size=self.bs, seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu,
                             req_pool_indices=req_pool_indices, out_cache_loc=None, spec_info=None,
                             kv_loc_plan=None)
        if mode == "draft_extend":  # SGLang's eager draft-extend metadata reads the window from these
            fb.extend_seq_lens = torch.full_like(seq_lens, self.window)
        return fb

    def _runner_lens(self, mode):
        """What the runner passes as seq_lens: decode and verify the committed lengths (verify adds the window in
        the metadata), draft extend the lengths with the padded window included."""
        return self.lens if mode != "draft_extend" else self.kv_lens(mode)

    def queries(self, mode):
        """q_nope [T, H, 512], q_rope [T, H, 64] in the layouts SGLang 0.5.17's absorbed forward hands the backend:
        q_nope the per-head BMM's [H, T, 512] output transposed (head-major), q_rope the RoPE slice of the projected
        q [T, H, 192] (a token stride of H x 192)."""
        rows = self.bs * self.s_q(mode)
        q = torch.randn(self.heads, rows, nx.KV_LORA_RANK, generator=self.gen).to(torch.bfloat16).to(self.device)
        projected = torch.randn(rows, self.heads, QK_NOPE_DIM + nx.ROPE_DIM, generator=self.gen)
        return q.transpose(0, 1), projected.to(torch.bfloat16).to(self.device)[..., QK_NOPE_DIM:]

    def forward(self, mode, fb, q, q_rope):
        if mode == "decode":
            return self.backend.forward_decode(q, None, None, self.layer, fb, save_kv_cache=False, q_rope=q_rope)
        return self.backend.forward_extend(q, None, None, self.layer, fb, save_kv_cache=False, q_rope=q_rope)

    def capture_metadata(self, mode):
        bs = self.bs
        fill = self.backend.get_cuda_graph_seq_len_fill_value()
        self.seq_lens_buf.fill_(fill)
        self.seq_lens_cpu_buf.fill_(fill)
        self.req_pool_buf.zero_()
        fb = self._forward_batch(mode, self.seq_lens_buf[:bs], self.seq_lens_cpu_buf[:bs], self.req_pool_buf[:bs])
        self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
        return fb

    def replay_metadata(self, mode):
        bs = self.bs
        lens = torch.tensor(self._runner_lens(mode), dtype=torch.int64)
        self.seq_lens_buf[:bs].copy_(lens)
        self.seq_lens_cpu_buf[:bs].copy_(lens)
        self.req_pool_buf[:bs].copy_(torch.arange(1, bs + 1))
        fb = self._forward_batch(mode, self.seq_lens_buf[:bs], self.seq_lens_cpu_buf[:bs], self.req_pool_buf[:bs])
        self.backend.init_forward_metadata_out_graph(fb)
        return fb

    def eager_metadata(self, mode):
        """FlashMLABackend's eager metadata (no graph) for the batch."""
        lens = torch.tensor(self._runner_lens(mode), dtype=torch.int64)
        fb = self._forward_batch(mode, lens.to(self.device), lens, torch.arange(1, self.bs + 1, device=self.device))
        self.backend.init_forward_metadata(fb)
        return fb

    def eager(self, mode, q, q_rope):
        """The eager metadata and the forward."""
        return self.forward(mode, self.eager_metadata(mode), q, q_rope)

    def graphed(self, mode, q, q_rope):
        """GPU: capture with the fill values, replay with the batch; returns the replayed output."""
        q_static, qr_static = zeros_in_layout(q), zeros_in_layout(q_rope)
        fb = self.capture_metadata(mode)
        self.forward(mode, fb, q_static, qr_static)  # warm-up (compiles), as the runner does before capture
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            out = self.forward(mode, fb, q_static, qr_static)
        torch.cuda.current_stream().wait_stream(stream)
        self.replay_metadata(mode)
        q_static.copy_(q)
        qr_static.copy_(q_rope)
        graph.replay()
        torch.cuda.synchronize()
        return out

    def reference(self, mode, q, q_rope):
        """The spec over the pool's contents: out [bs * s_q, H * 512] fp32."""
        s_q = self.s_q(mode)
        qq = nx.quantize_q(q.cpu().reshape(self.bs, s_q, self.heads, -1),
                           q_rope.cpu().reshape(self.bs, s_q, self.heads, -1))
        cache = nx.LatentCache(*(t.cpu() for t in self.pool.snapmla_buffers(0)))
        out, _ = nx.snapmla_decode_reference(qq, cache, self.block_tables, torch.tensor(self.kv_lens(mode)),
                                             self.layer.scaling)
        return out.reshape(self.bs * s_q, -1)

    def static_storages(self) -> set[int]:
        """Addresses of the buffers a captured graph reads in place (pool, block table, lengths)."""
        be = self.backend
        bufs = [*self.pool.snapmla_buffers(0), be.cuda_graph_kv_indices, be.cuda_graph_draft_extend_seq_lens_k,
                be.snapmla_graph_seq_lens]
        return {t.untyped_storage().data_ptr() for t in bufs}
