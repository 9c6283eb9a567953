"""The hierarchical cache's host tier for the snapmla pool (SGLang's HiCache, `--enable-hierarchical-cache`).

The device pool holds each token's cache in three arrays per layer (`pool.SnapMLATokenToKVPool`); the host pool
holds it as one 644-byte record per token and layer, the three arrays' bytes side by side:

    bytes [0, 512)    content  float8_e4m3fn [512]
    bytes [512, 516)  scale    float32
    bytes [516, 644)  rope     bfloat16 [64]

so that SGLang's host pool (`MLATokenToKVPoolHost`, a uint8 buffer with a 644-wide row, as its own packed layouts
use) sizes, allocates, lays out (layer_first, page_first, page_first_direct) and serializes pages for the storage
tier (get_data_page / set_from_flat_data_page / get_page_buffer_meta) unchanged. Only the moves between the device
and the host are ours: SGLang's transfer kernels copy one array per layer, so backup gathers the requested rows of
the three arrays on the device into records and load scatters records back into them -- every byte of all three,
whichever `--hicache-io-backend` is set (logged once).

`adopt_snapmla_device_pool` is the AROUND hook on MLATokenToKVPoolHost.__init__: a host pool built for a snapmla
device pool, wherever SGLang builds one, is this class.
"""

from __future__ import annotations

import functools
import logging

import torch
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from .host_pool_settings import IO_BACKENDS, LAYOUTS
from .layout import BYTES_PER_TOKEN, KV_LORA_RANK, ROPE_DIM

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

    def __init__(self, device_pool, *args, **kwargs):
        if kwargs.get("override_kv_cache_dim") not in (None, RECORD_BYTES):
            raise ValueError(f"the snapmla host pool's row is {RECORD_BYTES} bytes; got override_kv_cache_dim="
                             f"{kwargs['override_kv_cache_dim']}")
        kwargs["override_kv_cache_dim"] = RECORD_BYTES
        super().__init__(device_pool, *args, **kwargs)
        if self.layout not in LAYOUTS:
            raise ValueError(f"--hicache-mem-layout {self.layout} is not supported with --attention-backend snapmla; "
                             f"use one of {', '.join(LAYOUTS)}")

    def get_size_per_token(self):
        self.dtype = torch.uint8  # records of bytes, whatever the device pool's nominal dtype
        return super().get_size_per_token()

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
        _log_io_backend(io_backend)

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend):
        """Host records of host_indices -> the device pool's three arrays of layer_id at device_indices."""
        if not self._is_device_layer_owned(device_pool, layer_id):
            return
        self._note_io_backend(io_backend)
        host_indices, device_indices = self.dcp_kernel_indices(host_indices), self.dcp_kernel_indices(device_indices)
        page, offset = self._host_slots(host_indices)
        records = self._layer_pages(self._host_layer_index(layer_id))[page, offset]
        views = byte_views(*device_pool.layer_arrays(layer_id))  # not snapmla_buffers(): it waits for this load
        unpack_into(views, device_indices.to(views[0].device, torch.int64),
                    records.to(views[0].device, non_blocking=True))

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        """The device pool's three arrays at device_indices, every layer this rank owns -> host records."""
        self._note_io_backend(io_backend)
        host_indices, device_indices = self.dcp_kernel_indices(host_indices), self.dcp_kernel_indices(device_indices)
        page, offset = self._host_slots(host_indices)
        loc = device_indices.to(device_pool.kv_buffer[0].device, torch.int64)
        for layer_id in self._owned_device_layer_ids(device_pool):
            records = pack(byte_views(*device_pool.layer_arrays(layer_id)), loc)
            self._layer_pages(self._host_layer_index(layer_id))[page, offset] = records.to(self.kv_buffer.device)


@functools.lru_cache(maxsize=1)
def _log_io_backend(io_backend: str) -> None:
    """Once per process: what moves the pages, whichever io backend the server names."""
    logger.info("snapmla HiCache: pages move as 644-byte records (FP8 content, scale, RoPE) gathered and scattered "
                "with torch copies; --hicache-io-backend %s's transfer kernels move one array per layer and are not "
                "used", io_backend)


def adopt_snapmla_device_pool(original, host_pool, device_pool, *args, **kwargs):
    """AROUND MLATokenToKVPoolHost.__init__: a host pool of a snapmla device pool becomes SnapMLATokenToKVPoolHost."""
    from .pool import SnapMLATokenToKVPool

    if isinstance(device_pool, SnapMLATokenToKVPool) and not isinstance(host_pool, SnapMLATokenToKVPoolHost):
        host_pool.__class__ = SnapMLATokenToKVPoolHost
        return SnapMLATokenToKVPoolHost.__init__(host_pool, device_pool, *args, **kwargs)
    return original(host_pool, device_pool, *args, **kwargs)
