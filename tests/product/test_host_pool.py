"""The HiCache host tier for the snapmla pool (sglang_snapmla/host_pool.py): pages written on the device, backed up
to host records (and to SGLang's file storage), loaded back into other device slots are the same bytes in all three
arrays (FP8 content, fp32 scale, BF16 RoPE), in every host layout; the host pool is sized from snapmla's 644 bytes.

Pages move with the Triton record kernels (the default, after the host pool's build-time check against the torch
copies) or, with SNAPMLA_HICACHE_COPIES=torch, with the torch copies; both are tested, and a kernel that moves a
record differently is caught by the check and logged.

The host pool is built the way each SGLang release builds it: 0.5.17's HiRadixCache passes the device pool to
MLATokenToKVPoolHost, 0.5.23's `build_kv_host_pool` passes `get_device_pool_infos()[0].buffer_info` (here with the
server's memory settings given to it directly). The device pool lives on the CPU here (the Triton interpreter's
mode); on the GPU the copies go through pinned host memory, the kernels read and write it in place."""

from types import SimpleNamespace

import pytest
import torch

from sglang_snapmla import sglang_release

PAGE = 64
LAYERS = 3


@pytest.fixture(scope="module")
def plugin():
    from sglang_snapmla import plugin as p

    p.register()
    return p


def device_pool(pages=8):
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    return SnapMLATokenToKVPool(size=PAGE * pages, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=LAYERS, device="cpu", enable_memory_saver=False)


def host_pool(device, layout):
    """SGLang's own construction of the host pool for `device` (a snapmla pool, or SGLang's MLA pool)."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if sglang_release.installed() == "0.5.17":  # HiRadixCache's call
        return MLATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu")
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.pool_host import common

    # the server's settings where SGLang reads them (its runtime context, published by a server's start)
    memory = SimpleNamespace(hicache_ratio=2.0, hicache_size=0, hicache_mem_layout=layout, hicache_storage_backend=None)
    with pytest.MonkeyPatch.context() as mp:
        for module in (assembler, common):
            mp.setattr(module, "get_memory", lambda: memory)
        mp.setattr(assembler, "get_parallel", lambda: SimpleNamespace(dcp_enabled=False))
        return assembler.build_kv_host_pool(kv_pool=device, page_size=PAGE)


def fill_random(pool, gen):
    """Every byte of every layer's three arrays random (non-finite FP8 / fp32 / BF16 patterns included)."""
    for arrays in (pool.kv_buffer, pool.kv_scale_buffer, pool.kv_rope_buffer):
        for a in arrays:
            a.view(torch.uint8).copy_(torch.randint(0, 256, a.view(torch.uint8).shape, dtype=torch.uint8,
                                                    generator=gen))


def slots(pages: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def assert_same_rows(src, src_loc, dst, dst_loc):
    for name in ("kv_buffer", "kv_scale_buffer", "kv_rope_buffer"):
        for layer in range(LAYERS):
            a = getattr(src, name)[layer][src_loc].view(torch.uint8)
            b = getattr(dst, name)[layer][dst_loc].view(torch.uint8)
            assert torch.equal(a, b), f"{name} layer {layer}: {(a != b).sum().item()} bytes differ"


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("copies", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_pages_come_back_byte_for_byte(plugin, monkeypatch, layout, copies):
    """Both ways of moving records: the Triton record kernels (the default) and the torch copies (the kernels' spec
    and their fallback; SNAPMLA_HICACHE_COPIES=torch)."""
    from sglang_snapmla.host_pool import RECORD_BYTES, SnapMLATokenToKVPoolHost

    monkeypatch.setenv("SNAPMLA_HICACHE_COPIES", "kernels" if copies == "triton" else "torch")
    gen = torch.Generator().manual_seed(7)
    device = device_pool()
    fill_random(device, gen)
    host = host_pool(device, layout)
    assert isinstance(host, SnapMLATokenToKVPoolHost) and host.kv_buffer.dtype == torch.uint8
    assert host.record_copies == copies
    assert host.get_size_per_token() == RECORD_BYTES * LAYERS and host.size >= 2 * device.size
    written = slots([5, 2, 7])  # pages out of order
    host_loc = host.alloc(len(written))
    host.backup_from_device_all_layer(device, host_loc, written, "kernel")
    # evicted: the device pages are reused (new bytes), then the prefix comes back into other pages
    before = device_pool()
    for name in ("kv_buffer", "kv_scale_buffer", "kv_rope_buffer"):
        for layer in range(LAYERS):
            getattr(before, name)[layer].copy_(getattr(device, name)[layer])
    fill_random(device, gen)
    loaded = slots([1, 6, 3])
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, host_loc, loaded, layer, "direct")
    assert_same_rows(before, written, device, loaded)


@pytest.mark.cpu_interpreter
def test_pages_come_back_through_file_storage(plugin, tmp_path):
    """Host page -> SGLang's HiCacheFile -> another host page (get_data_page / set_from_flat_data_page, as the cache
    controller's storage backup and prefetch call them) -> device."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    gen = torch.Generator().manual_seed(8)
    device = device_pool()
    fill_random(device, gen)
    host = host_pool(device, "page_first")
    storage = HiCacheFile(HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=True,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="snapmla-test"), file_path=str(tmp_path))
    written = slots([4])
    first = host.alloc(PAGE)
    host.backup_from_device_all_layer(device, first, written, "kernel")
    assert storage.set("page-key", host.get_data_page(int(first[0]), flat=True))
    fetched = storage.get("page-key", host.get_dummy_flat_data_page())
    second = host.alloc(PAGE)
    host.set_from_flat_data_page(int(second[0]), fetched)
    loaded = slots([0])
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, second, loaded, layer, "kernel")
    assert_same_rows(device, written, device, loaded)


@pytest.mark.cpu_interpreter
def test_other_device_pools_keep_sglangs_host_pool(plugin, monkeypatch):
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host import mla

    if sglang_release.installed() != "0.5.17":  # 0.5.23's builder pins host memory, which needs a GPU
        monkeypatch.setattr(mla, "ALLOC_MEMORY_FUNCS", {"cpu": lambda dims, dtype, device, **_: torch.empty(
            dims, dtype=dtype, device=device)})
    bf16 = MLATokenToKVPool(PAGE * 4, PAGE, torch.bfloat16, 512, 64, LAYERS, "cpu", False)
    host = host_pool(bf16, "layer_first")
    assert type(host) is mla.MLATokenToKVPoolHost and host.kv_cache_dim == 576


@pytest.mark.cpu_interpreter
def test_unsupported_layouts_and_io_backends_are_refused(plugin):
    host = host_pool(device_pool(), "layer_first")
    with pytest.raises(ValueError, match="--hicache-io-backend kernel_ascend is not supported"):
        host.backup_from_device_all_layer(host.device_pool, host.alloc(PAGE), slots([1]), "kernel_ascend")


@pytest.mark.cpu_interpreter
def test_record_kernels_that_disagree_with_the_copies_are_not_used(plugin, monkeypatch, caplog):
    """The start-up check: a record kernel that drops the scale is caught, logged, and the torch copies serve; the
    host buffer's bytes the check used are restored."""
    from sglang_snapmla import host_pool as hp
    from sglang_snapmla import ops

    real = ops.pool_to_records

    def scale_dropped(host_words, record_words, loc, content, scale, rope):
        real(host_words, record_words, loc, content, torch.zeros_like(scale), rope)

    monkeypatch.setattr(ops, "pool_to_records", scale_dropped)
    monkeypatch.delenv("SNAPMLA_HICACHE_COPIES", raising=False)  # the default asks for the kernels
    hp._fall_back.cache_clear()
    device = device_pool()
    with caplog.at_level("WARNING", logger=hp.__name__):
        host = host_pool(device, "layer_first")
    assert host.record_copies == "torch"
    assert "wrote host records that differ from the torch copies'" in caplog.text
    rows = host._layer_pages(0)[0, :2]
    rows.copy_(torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1)))
    before = rows.clone()
    assert host._record_kernels_problem(device.kv_buffer[0].device) is not None
    assert torch.equal(rows, before), "the check left its bytes in the host pool"
    # and the pool still moves pages exactly, with the copies
    gen = torch.Generator().manual_seed(9)
    fill_random(device, gen)
    host_loc = host.alloc(PAGE)
    host.backup_from_device_all_layer(device, host_loc, slots([3]), "kernel")
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, host_loc, slots([5]), layer, "kernel")
    assert_same_rows(device, slots([3]), device, slots([5]))


@pytest.mark.cpu_interpreter
def test_an_unknown_copies_setting_is_refused_when_the_host_pool_is_built(plugin, monkeypatch):
    monkeypatch.setenv("SNAPMLA_HICACHE_COPIES", "kernel")
    with pytest.raises(ValueError, match="SNAPMLA_HICACHE_COPIES=kernel: use kernels \\(the default\\) or torch"):
        host_pool(device_pool(), "layer_first")
