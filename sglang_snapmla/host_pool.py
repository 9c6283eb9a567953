"""The hierarchical cache's host tier for the snapmla pool (SGLang's HiCache, `--enable-hierarchical-cache`).

The device pool holds each token's cache in three arrays per layer (`pool.SnapMLATokenToKVPool`); the host pool
holds it as one 644-byte record per token and layer, the three arrays' bytes side by side:

    bytes [0, 512)    content  float8_e4m3fn [512]
    bytes [512, 516)  scale    float32
    bytes [516, 644)  rope     bfloat16 [64]

so that SGLang's host pool (`MLATokenToKVPoolHost`, a uint8 buffer with a 644-wide row, as its own packed layouts
use) sizes, allocates, lays out (layer_first, page_first, page_first_direct) and serializes pages for the storage
tier (get_data_page / set_from_flat_data_page / get_page_buffer_meta) unchanged. Only the moves between the device
and the host are ours: SGLang's transfer kernels copy one array per layer (and its JIT ones refuse rows that are not
a multiple of 128 bytes), so backup writes the requested rows of the three arrays into their host records and load
writes records back into them -- every byte of all three, whichever `--hicache-io-backend` is set. Triton kernels
that read and write the page-locked host pool in place (`ops.records_to_pool` / `ops.pool_to_records`, as SGLang's
own transfer kernels do for BF16 rows) move them, after a check when the host pool is built that they move records
on this pool's memory exactly as the torch copies do (`pack` / `unpack_into`, the spec: records gathered on the CPU,
synchronous). Where the check fails, or SNAPMLA_HICACHE_COPIES=torch asks for them, the torch copies move the
records; a failed check's reason is logged once, and which of the two moves the pages is logged once.

Where SGLang builds the host pool from differs by release: 0.5.17 passes the device pool itself; 0.5.23 passes the
`buffer_info` of the device pool's `get_device_pool_infos()`, an MLABufferInfo of one [N, 1, 576] tensor per layer,
which the three arrays are not -- the snapmla pool answers with `pool.SnapMLAHostRecords`, the records' geometry.
`adopt_snapmla_device_pool` is the AROUND hook on MLATokenToKVPoolHost.__init__ for both: a host pool built for a
snapmla device pool, wherever SGLang builds one, is this class.
"""

from __future__ import annotations

import functools
import logging

import torch
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from . import ops
from .host_pool_settings import IO_BACKENDS, LAYOUTS
from .layout import BYTES_PER_TOKEN, KV_LORA_RANK, ROPE_DIM
from .settings import HICACHE_COPIES_ENV, interpreter_mode, requested_hicache_copies

logger = logging.getLogger(__name__)

CONTENT_BYTES = KV_LORA_RANK  # fp8: one byte per channel
SCALE_BYTES = 4
ROPE_BYTES = ROPE_DIM * 2
RECORD_BYTES = CONTENT_BYTES + SCALE_BYTES + ROPE_BYTES
assert RECORD_BYTES == BYTES_PER_TOKEN  # the device pool's bytes per token and layer, 644
# byte ranges of a record, in the order of the device pool's arrays (content, scale, rope)
FIELDS = ((0, CONTENT_BYTES), (CONTENT_BYTES, CONTENT_BYTES + SCALE_BYTES), (CONTENT_BYTES + SCALE_BYTES, RECORD_BYTES))


def byte_views(content: torch.Tensor, scale: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One layer's device arrays as uint8 rows: content [N, 512], scale [N, 4], rope [N, 128] (views, no copy)."""
    return content.view(torch.uint8), scale.view(torch.uint8).view(-1, SCALE_BYTES), rope.view(torch.uint8)


def pack(views: tuple[torch.Tensor, ...], loc: torch.Tensor) -> torch.Tensor:
    """Records [len(loc), 644] uint8 of the slots loc, from `byte_views` of one layer."""
    return torch.cat([v.index_select(0, loc) for v in views], dim=1)


def unpack_into(views: tuple[torch.Tensor, ...], loc: torch.Tensor, records: torch.Tensor) -> None:
    """Write records [len(loc), 644] uint8 into the slots loc of `byte_views` of one layer."""
    for v, (lo, hi) in zip(views, FIELDS):
        v.index_copy_(0, loc, records[:, lo:hi])


class SnapMLATokenToKVPoolHost(MLATokenToKVPoolHost):
    """SGLang's MLA host pool with 644-byte uint8 records (content, scale, rope of one token and layer)."""

    def __init__(self, source, *args, **kwargs):
        """source: the snapmla device pool (SGLang 0.5.17) or its SnapMLAHostRecords (0.5.23); the rest as SGLang
        passes them to MLATokenToKVPoolHost."""
        from .pool import SnapMLAHostRecords

        # 0.5.23's builder passes the device pool's nominal row (kv_lora_rank + rope dim) as the override
        accepted = (None, RECORD_BYTES, getattr(getattr(source, "pool", None), "kv_cache_dim", None))
        if kwargs.get("override_kv_cache_dim") not in accepted:
            raise ValueError(f"the snapmla host pool's row is {RECORD_BYTES} bytes; got override_kv_cache_dim="
                             f"{kwargs['override_kv_cache_dim']}")
        kwargs["override_kv_cache_dim"] = RECORD_BYTES
        # before SGLang allocates for it: its MLA host pool builds layouts the records are not laid out for (Ascend's
        # page_first_kv_split fails inside it on a snapmla pool); args: (host_to_device_ratio, host_size, page_size,
        # layout, ...) where SGLang passes them by position
        _check_layout(kwargs.get("layout", args[3] if len(args) > 3 else None))
        if isinstance(source, SnapMLAHostRecords):
            self._init_from_records(source, *args, **kwargs)
        else:
            super().__init__(source, *args, **kwargs)
        if self.dcp_size != 1:  # refused at startup (--dcp-size > 1); the copies below take slots as they come
            raise ValueError("the snapmla host pool serves --dcp-size 1 only")
        self.record_copies = self._choose_record_copies()

    def _init_from_records(self, records, host_to_device_ratio, host_size, page_size, layout,
                           pin_memory=True, device="cpu", allocator_type="default", override_kv_cache_dim=None,
                           draft_buffer_infos=(), dcp_size=1, dcp_rank=0, *, device_capacity_tokens, start_layer,
                           end_layer, target_layer_num, layer_shard_enabled=False, pool_label="kv",
                           host_token_capacity=None):
        """SGLang 0.5.23: what its MLATokenToKVPoolHost.__init__ sets up from an MLABufferInfo (its own __init__
        validates one [N, 1, row] tensor per layer), set up from the records' geometry (`pool.SnapMLAHostRecords`),
        then its HostKVCache allocation: host rows of RECORD_BYTES uint8 per layer, no device pointer table (pages
        move by our copies, not SGLang's JIT kernels)."""
        from sglang.srt.mem_cache.pool_host.base import HostKVCache

        if draft_buffer_infos:
            raise ValueError("--enable-hierarchical-cache with --attention-backend snapmla keeps no MTP draft layers "
                             "in the host pool on SGLang 0.5.23; drop --speculative-algorithm or the flag")
        if layer_shard_enabled:
            raise ValueError("--enable-hierarchical-cache with --attention-backend snapmla does not serve a "
                             "layer-sharded KV pool")
        self._is_dummy, self.override_kv_cache_dim = False, override_kv_cache_dim
        self.dtype, self.layout, self.kv_cache_dim = torch.uint8, layout, RECORD_BYTES
        self.kv_lora_rank, self.qk_rope_head_dim = records.kv_lora_rank, records.qk_rope_head_dim
        self.dsa_kv_cache_store_fp8, self._native_buffers = False, None
        self.target_layer_num = self.layer_num = target_layer_num
        self._layer_shard_enabled, self._draft_layer_num = False, 0
        self._transfer_device, self._device_layer_num = records.device, records.device_layer_num
        self._target_layer_indices = records.layer_indices
        self._host_layer_by_controller = {layer: i for i, layer in enumerate(records.layer_indices)}
        self._size_per_token = RECORD_BYTES * self.layer_num
        self.device_pool = records.pool
        # pinned (registered) host memory is for copies from a GPU; a CPU device pool (the Triton interpreter's
        # mode) copies between plain CPU tensors
        pin_memory = pin_memory and records.device.type == "cuda"
        HostKVCache.__init__(self, dtype=torch.uint8, device_capacity_tokens=device_capacity_tokens,
                             size_per_token=self._size_per_token, start_layer=start_layer, end_layer=end_layer,
                             host_to_device_ratio=host_to_device_ratio, host_size=host_size, page_size=page_size,
                             layout=layout, pin_memory=pin_memory, device=device, allocator_type=allocator_type,
                             dcp_size=dcp_size, dcp_rank=dcp_rank, pool_label=pool_label,
                             host_token_capacity=host_token_capacity)
        self.can_use_jit = self.can_use_write_back_jit = False
        self.staging_page_capacity = self.staging_token_capacity = 0
        self.staging_buffer, self.device_kv_buffers, self.device_data_ptrs, self.data_ptrs = None, (), None, None
        per_layer = self.kv_buffer.transpose(0, 1) if layout == "page_first" else self.kv_buffer
        self.data_refs = [per_layer[i] for i in range(self.layer_num)]  # registration with transfer engines

    def get_size_per_token(self):
        self.dtype = torch.uint8  # records of bytes, whatever the device pool's nominal dtype
        return super().get_size_per_token()  # 0.5.23: the _size_per_token _init_from_records set

    def _layer_pages(self, host_layer: int) -> torch.Tensor:
        """One layer's records as [pages, page_size, 644] (a view of the host buffer in any layout)."""
        if self.layout == "layer_first":
            rows = self.kv_buffer[host_layer, :, 0]
        elif self.layout == "page_first":
            rows = self.kv_buffer[:, host_layer, 0]
        else:  # page_first_direct: [page, layer, page_size, 1, 644]
            return self.kv_buffer[:, host_layer, :, 0]
        return rows.unflatten(0, (-1, self.page_size))

    def _host_slots(self, host_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = host_indices.to(device=self.kv_buffer.device, dtype=torch.int64)
        return idx // self.page_size, idx % self.page_size

    def _note_io_backend(self, io_backend: str) -> None:
        if io_backend not in IO_BACKENDS:
            raise ValueError(f"--hicache-io-backend {io_backend} is not supported with --attention-backend snapmla; "
                             f"use one of {', '.join(IO_BACKENDS)}")
        _log_io_backend(io_backend, self.record_copies)

    @property
    def _host_words(self) -> torch.Tensor:
        """The whole host buffer as a flat int32 view (records are 161 words at word-aligned offsets)."""
        return self.kv_buffer.view(-1).view(torch.int32)

    def _record_words(self, page: torch.Tensor, offset: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The int32-word offsets of the records (page, offset) within a host layer, int64 on `device`: add
        `_layer_words(host_layer)` for that layer's (every layout gives all layers the same page and row strides)."""
        pages = self._layer_pages(0)
        return ((page * pages.stride(0) + offset * pages.stride(1)) // 4).to(device, non_blocking=True)  # uint8: bytes

    def _layer_words(self, host_layer: int) -> int:
        """Where a host layer's records start in `_host_words`, in int32 words."""
        return (self._layer_pages(host_layer).data_ptr() - self.kv_buffer.data_ptr()) // 4

    def _choose_record_copies(self) -> str:
        """"triton" where the record kernels (SNAPMLA_HICACHE_COPIES=kernels, the default) run on this pool's memory
        and move records as the torch copies do (checked once on two records of the host buffer, restored
        afterwards), else "torch" (SNAPMLA_HICACHE_COPIES=torch, or a failed check, whose reason is logged once)."""
        device = self.device_pool.kv_buffer[0].device
        if requested_hicache_copies() == "torch":
            return "torch"
        if device.type != "cuda" and not interpreter_mode():
            return _fall_back("the device pool is not on a GPU")
        problem = self._record_kernels_problem(device)
        return "triton" if problem is None else _fall_back(problem)

    def _record_kernels_problem(self, device: torch.device) -> str | None:
        """None if the kernels round-trip two random records through host layer 0 exactly as pack / unpack_into
        do; else what went wrong (a host pool that is not page-locked, which a kernel cannot reach, fails here)."""
        n = 2
        page, offset = torch.zeros(n, dtype=torch.int64), torch.arange(n, dtype=torch.int64)
        host_rows = self._layer_pages(0)[0, :n]
        saved = host_rows.clone()
        gen = torch.Generator().manual_seed(0)
        scratch = (torch.empty(n, KV_LORA_RANK, dtype=torch.float8_e4m3fn, device=device),
                   torch.empty(n, dtype=torch.float32, device=device),
                   torch.empty(n, ROPE_DIM, dtype=torch.bfloat16, device=device))
        views = byte_views(*scratch)
        for v in views:
            v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=gen))
        loc = torch.arange(n, device=device)
        expected = pack(views, loc).cpu()
        try:
            words = self._record_words(page, offset, device) + self._layer_words(0)
            ops.pool_to_records(self._host_words, words, loc, *scratch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            written = host_rows.cpu().clone()
            for v in views:
                v.zero_()
            ops.records_to_pool(self._host_words, words, loc, *scratch)
            read_back = pack(views, loc).cpu()
        except Exception as e:  # the fallback names it; serving goes on with the torch copies
            return f"the record kernels failed ({e!r:.200})"
        finally:
            host_rows.copy_(saved)
        if not torch.equal(written, expected):
            return "the record kernels wrote host records that differ from the torch copies'"
        if not torch.equal(read_back, expected):
            return "the record kernels read host records back differently from the torch copies"
        return None

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend, *,
                                 is_draft: bool = False):
        """Host records of host_indices -> the device pool's three arrays of layer_id (its local layer index) at
        device_indices. is_draft: SGLang 0.5.23's packed MTP layers, which this pool does not hold."""
        if is_draft or not self._is_device_layer_owned(device_pool, layer_id):
            return
        self._note_io_backend(io_backend)
        page, offset = self._host_slots(host_indices)
        host_layer = self._host_layer_index(layer_id)
        arrays = device_pool.layer_arrays(layer_id)  # not snapmla_buffers(): it waits for this load
        loc = device_indices.to(arrays[0].device, torch.int64)
        if self.record_copies == "triton":
            words = self._record_words(page, offset, loc.device) + self._layer_words(host_layer)
            ops.records_to_pool(self._host_words, words, loc, *arrays)
            return
        records = self._layer_pages(host_layer)[page, offset]
        unpack_into(byte_views(*arrays), loc, records.to(loc.device, non_blocking=True))

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        """The device pool's three arrays at device_indices, every layer this rank owns -> host records."""
        self._note_io_backend(io_backend)
        page, offset = self._host_slots(host_indices)
        loc = device_indices.to(device_pool.kv_buffer[0].device, torch.int64)
        # the records' offsets within a layer, moved to the device once for all layers
        words = self._record_words(page, offset, loc.device) if self.record_copies == "triton" else None
        for layer_id in self._owned_device_layer_ids(device_pool):
            host_layer = self._host_layer_index(layer_id)
            if words is not None:
                ops.pool_to_records(self._host_words, words + self._layer_words(host_layer), loc,
                                    *device_pool.layer_arrays(layer_id))
                continue
            records = pack(byte_views(*device_pool.layer_arrays(layer_id)), loc)
            self._layer_pages(host_layer)[page, offset] = records.to(self.kv_buffer.device)


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"--hicache-mem-layout {layout} is not supported with --attention-backend snapmla; "
                         f"use one of {', '.join(LAYOUTS)}")


@functools.lru_cache(maxsize=None)
def _log_io_backend(io_backend: str, record_copies: str) -> None:
    """Once per process: what moves the pages, whichever io backend the server names."""
    how = ("Triton kernels reading and writing the page-locked host pool in place" if record_copies == "triton"
           else "torch copies (gathered on the CPU, synchronous)")
    logger.info("snapmla HiCache: pages move as 644-byte records (FP8 content, scale, RoPE) with %s; "
                "--hicache-io-backend %s's transfer kernels move one array per layer and are not used", how, io_backend)


@functools.lru_cache(maxsize=None)
def _fall_back(reason: str) -> str:
    """The torch copies, with the reason logged once per process (a warning: they keep the GPU waiting)."""
    logger.warning("snapmla HiCache: pages move with torch copies, not the record kernels (%s=kernels, the default): "
                   "%s", HICACHE_COPIES_ENV, reason)
    return "torch"


def adopt_snapmla_device_pool(original, host_pool, source, *args, **kwargs):
    """AROUND MLATokenToKVPoolHost.__init__: a host pool of a snapmla device pool (SGLang 0.5.17 passes the pool,
    0.5.23 its SnapMLAHostRecords) becomes SnapMLATokenToKVPoolHost."""
    from .pool import SnapMLAHostRecords, SnapMLATokenToKVPool

    if isinstance(source, (SnapMLATokenToKVPool, SnapMLAHostRecords)) and not isinstance(host_pool,
                                                                                          SnapMLATokenToKVPoolHost):
        host_pool.__class__ = SnapMLATokenToKVPoolHost
        return SnapMLATokenToKVPoolHost.__init__(host_pool, source, *args, **kwargs)
    return original(host_pool, source, *args, **kwargs)
