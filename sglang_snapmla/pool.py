"""The SnapMLA KV pool: SGLang's MLA pool with the 644-byte per-token layout.

Per layer three arrays over `size + page_size` slots (slot 0 is SGLang's dummy slot for padded tokens), named
content, scale and rope as in the spec (`numerics.LatentCache`) and the kernels (`kv_content`, `kv_scale`, `kv_rope`):

    kv_buffer[l]        [N, 512] float8_e4m3fn   content: c_kv / scale (SGLang's attribute name, which its
                                                 engine code reads, holds the content array)
    kv_scale_buffer[l]  [N]      float32         scale: per token
    kv_rope_buffer[l]   [N, 64]  bfloat16        rope: k_rope / scale (scale-domain aligned)

Writes go through the fused K-append kernel, reads for MHA prefill / prefix reuse through fetch-dequant (only the
requested rows). There is no single 576-wide tensor: `get_key_buffer` / `get_value_buffer` raise and name the
accessors to use instead.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, get_tensor_size_bytes, unwrap_write_loc

from . import library
from . import ops
from .gpu import unsupported_gpu
from .layout import BYTES_PER_TOKEN, FP8_DTYPE, KV_LORA_RANK, PAGE_SIZE, ROPE_DIM


class SnapMLATokenToKVPool(MLATokenToKVPool):
    """MLATokenToKVPool storing FP8 content + fp32 scale + aligned bf16 RoPE (644 B/token/layer)."""

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str, enable_memory_saver: bool, start_layer: Optional[int] = None,
                 end_layer: Optional[int] = None, **kwargs):
        check_pool_config(kv_lora_rank, qk_rope_head_dim, page_size, device)
        super().__init__(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device,
                         enable_memory_saver, start_layer, end_layer, **kwargs)

    # ---- allocation ------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """Slots of each per-layer array: the pool's tokens and the padded page, which holds slot 0, the dummy output
        slot."""
        return self.size + self.page_size

    def _create_buffers(self):
        n = self.num_slots
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            with torch.cuda.use_mem_pool(self.custom_mem_pool) if self.custom_mem_pool else nullcontext():
                # zeros, not empty: a never-written slot must read back as finite values (scale 0 -> 0)
                self.kv_buffer = [torch.zeros(n, KV_LORA_RANK, dtype=FP8_DTYPE, device=self.device)
                                  for _ in range(self.layer_num)]
                self.kv_scale_buffer = [torch.zeros(n, dtype=torch.float32, device=self.device)
                                        for _ in range(self.layer_num)]
                self.kv_rope_buffer = [torch.zeros(n, ROPE_DIM, dtype=torch.bfloat16, device=self.device)
                                       for _ in range(self.layer_num)]

    def _clear_buffers(self):
        del self.kv_buffer, self.kv_scale_buffer, self.kv_rope_buffer

    def _all_buffers(self):
        return [*self.kv_buffer, *self.kv_scale_buffer, *self.kv_rope_buffer]

    def get_kv_size_bytes(self):
        return sum(get_tensor_size_bytes(t) for t in self._all_buffers())

    def get_contiguous_buf_infos(self):
        """(data_ptrs, data_lens, item_lens) of every buffer, for PD-disaggregation transfers: per layer the
        content, scale and rope arrays, each transferred page by page (item = one page of that array)."""
        bufs = self._all_buffers()
        return ([b.data_ptr() for b in bufs], [b.nbytes for b in bufs],
                [b[0].nbytes * self.page_size for b in bufs])

    # ---- the engine's accessors ------------------------------------------------------------------------
    def snapmla_buffers(self, layer_id: int):
        """(kv_content [N, 512], kv_scale [N], kv_rope [N, 64]) of one layer, as the SnapMLA kernels take them."""
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return self.layer_arrays(layer_id - self.start_layer)

    def layer_arrays(self, i: int):
        """(content, scale, rope) of the pool's i-th layer (local index), without waiting for a layer being loaded:
        for what moves the layers themselves (offload, the hierarchical cache's host pool)."""
        return self.kv_buffer[i], self.kv_scale_buffer[i], self.kv_rope_buffer[i]

    def _mla_buffer_info(self):
        """SGLang 0.5.23 describes an MLA pool to its HiCache host-pool builder as one [N, 1, 576] tensor per layer
        (MLABufferInfo, from `get_device_pool_infos`); this pool has three arrays per layer, so it answers with the
        geometry of its 644-byte host records, which host_pool.SnapMLATokenToKVPoolHost is built from."""
        if getattr(self, "layer_shard_enabled", False):
            raise ValueError("--attention-backend snapmla does not serve a layer-sharded KV pool with HiCache")
        return SnapMLAHostRecords(pool=self, layer_indices=tuple(range(self.layer_num)),
                                  device_layer_num=self.layer_num, page_size=self.page_size)

    def get_key_buffer(self, layer_id: int):
        raise NotImplementedError(
            "the snapmla KV pool stores FP8 content, a per-token scale and scale-aligned BF16 RoPE in three arrays; "
            "there is no 576-wide key tensor. Read rows with get_mla_kv_buffer (dequantized) or the raw arrays "
            "with snapmla_buffers(layer_id); a caller that needs a BF16 pool must run another --attention-backend")

    get_value_buffer = get_key_buffer

    def get_kv_buffer(self, layer_id: int):
        return self.get_key_buffer(layer_id)

    def set_kv_buffer(self, layer, loc_info, cache_k: torch.Tensor, cache_v: torch.Tensor):
        """cache_k [T, 1, 576] (latent + RoPE key, model dtype) -> quantize and write at loc."""
        loc, _, _ = unwrap_write_loc(loc_info)
        k = cache_k.reshape(cache_k.shape[0], -1)
        self._append(layer.layer_id, loc, k[:, : self.kv_lora_rank], k[:, self.kv_lora_rank:])

    def set_mla_kv_buffer(self, layer, loc: torch.Tensor, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor):
        """cache_k_nope [T, 1, 512], cache_k_rope [T, 1, 64] -> one fused quantize + align + paged-write launch."""
        self._append(layer.layer_id, loc, cache_k_nope, cache_k_rope)

    def _append(self, layer_id, loc, k_nope, k_rope):
        kv, scale, rope = self.snapmla_buffers(layer_id)
        library.append_kv(k_nope.to(torch.bfloat16), k_rope.to(torch.bfloat16), loc, kv, scale, rope)

    def get_mla_kv_buffer(self, layer, loc: torch.Tensor, dst_dtype: Optional[torch.dtype] = None):
        """Dequantized rows: (k_nope [N, 1, 512], k_rope [N, 1, 64]) in dst_dtype (default bf16)."""
        c, r = library.fetch_dequant(loc, *self.snapmla_buffers(layer.layer_id))
        dst_dtype = dst_dtype or torch.bfloat16
        return c.unsqueeze(1).to(dst_dtype), r.unsqueeze(1).to(dst_dtype)

    # ---- relocation, offload ---------------------------------------------------------------------------
    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        if tgt_loc.numel() == 0:
            return
        tgt, src = tgt_loc.view(-1).long(), src_loc.view(-1).long()
        for buf in self._all_buffers():
            buf[tgt] = buf[src]

    def get_cpu_copy(self, indices, mamba_indices=None):
        self._sync()
        chunk = self.cpu_offloading_chunk_size
        out = []
        for layer in range(self.layer_num):
            arrays = self.layer_arrays(layer)
            out.append([tuple(a[indices[i:i + chunk]].to("cpu", non_blocking=True) for a in arrays)
                        for i in range(0, len(indices), chunk)])
        self._sync()
        return out

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):
        self._sync()
        chunk = self.cpu_offloading_chunk_size
        for layer in range(self.layer_num):
            arrays = self.layer_arrays(layer)
            for i in range(0, len(indices), chunk):
                idx = indices[i:i + chunk]
                for dst, src in zip(arrays, kv_cache_cpu[layer][i // chunk]):
                    dst[idx] = src.to(dst.device, non_blocking=True)
        self._sync()

    def _sync(self):
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass(frozen=True)
class SnapMLAHostRecords:
    """A snapmla device pool as SGLang 0.5.23's host-pool builder receives it (`buffer_info` of
    `get_device_pool_infos()`, where SGLang's MLA pool gives an MLABufferInfo): the pool and its layer slots; the
    host rows are BYTES_PER_TOKEN uint8 bytes per token and layer (host_pool's records)."""

    pool: "SnapMLATokenToKVPool"
    layer_indices: tuple[int, ...]  # the pool's local layers, the host controller's layer ids
    device_layer_num: int
    page_size: int
    kv_lora_rank: int = KV_LORA_RANK
    qk_rope_head_dim: int = ROPE_DIM
    kv_cache_dim: int = BYTES_PER_TOKEN
    dtype: torch.dtype = torch.uint8
    packed_fp8: bool = False  # SGLang's DSA flag, read by its builders
    scales: None = None  # SGLang's FP4 block scales: none

    @property
    def device(self) -> torch.device:
        return self.pool.kv_buffer[0].device


def check_pool_config(kv_lora_rank: int, qk_rope_head_dim: int, page_size: int, device) -> None:
    """The model/server settings the 644-byte layout supports; one clear error each."""
    if kv_lora_rank != KV_LORA_RANK or qk_rope_head_dim != ROPE_DIM:
        raise ValueError(f"--attention-backend snapmla needs kv_lora_rank=512 and qk_rope_head_dim=64 (DeepSeek-V2/V3/"
                         f"R1, LongCat-Flash); this model has {kv_lora_rank} and {qk_rope_head_dim}. "
                         "Use another --attention-backend for it.")
    if page_size != PAGE_SIZE:
        raise ValueError(f"--attention-backend snapmla stores the cache in 64-token pages; got --page-size {page_size}. "
                         "Pass --page-size 64 (or leave it unset).")
    if ops.interpreter_mode():  # the CPU interpreter runs the kernels on any device
        return
    if torch.device(device).type != "cuda":
        raise ValueError(f"--attention-backend snapmla runs on CUDA GPUs (Hopper is the tuned target); got device "
                         f"{device!r}. Use --device cuda, or another backend on this device.")
    unsupported = unsupported_gpu(device)
    if unsupported:
        raise ValueError(unsupported)

