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


def device_pool(pages=8, start_layer=None):
    """A snapmla pool of LAYERS layers; `start_layer`: a pipeline stage's first (global) layer."""
    from sglang_snapmla.pool import SnapMLATokenToKVPool

    return SnapMLATokenToKVPool(size=PAGE * pages, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=512,
                                qk_rope_head_dim=64, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
                                start_layer=start_layer)


def host_pool(device, layout, **builder_kwargs):
    """SGLang's own construction of the host pool for `device` (a snapmla pool, or SGLang's MLA pool);
    builder_kwargs: what else the release's builder passes (override_kv_cache_dim; 0.5.23's mtp_draft_device_pools)."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if sglang_release.installed() == "0.5.17":  # HiRadixCache's call
        return MLATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu", **builder_kwargs)
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.pool_host import common

    # the server's settings where SGLang reads them (its runtime context, published by a server's start)
    memory = SimpleNamespace(hicache_ratio=2.0, hicache_size=0, hicache_mem_layout=layout, hicache_storage_backend=None)
    with pytest.MonkeyPatch.context() as mp:
        for module in (assembler, common):
            mp.setattr(module, "get_memory", lambda: memory)
        mp.setattr(assembler, "get_parallel", lambda: SimpleNamespace(dcp_enabled=False))
        return assembler.build_kv_host_pool(kv_pool=device, page_size=PAGE, **builder_kwargs)


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
    # a load too (HiCache's prefetch loads pages a storage tier holds, which this process never backed up)
    with pytest.raises(ValueError, match="--hicache-io-backend kernel_ascend is not supported"):
        host.load_to_device_per_layer(host.device_pool, host.alloc(PAGE), slots([1]), 0, "kernel_ascend")
    # a layout SGLang's MLA host pool builds (Ascend's: content and RoPE in two buffers), not the records' layout
    with pytest.raises(ValueError, match="--hicache-mem-layout page_first_kv_split is not supported with "
                                         "--attention-backend snapmla; use one of layer_first, page_first"):
        host_pool(device_pool(), "page_first_kv_split")


@pytest.mark.cpu_interpreter
def test_what_moves_the_pages_is_logged_once(plugin, caplog):
    """The line saying that records, not the io backend's kernels, move the pages is logged once per process, by
    whichever of a load or a backup comes first."""
    from sglang_snapmla import host_pool as hp

    device = device_pool()
    host = host_pool(device, "layer_first")
    host_loc = host.alloc(PAGE)
    hp._log_io_backend.cache_clear()
    with caplog.at_level("INFO", logger=hp.__name__):
        for layer in range(LAYERS):
            host.load_to_device_per_layer(device, host_loc, slots([1]), layer, "direct")
        host.backup_from_device_all_layer(device, host_loc, slots([2]), "direct")
    lines = [r.getMessage() for r in caplog.records if "pages move as 644-byte records" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"with {'Triton kernels' if host.record_copies == 'triton' else 'torch copies'}" in lines[0]
    assert "--hicache-io-backend direct's transfer kernels move one array per layer and are not used" in lines[0]


@pytest.mark.cpu_interpreter
def test_a_host_row_other_than_the_records_is_refused(plugin):
    """The builder's row override (0.5.23 passes the device pool's nominal 576; both releases accept 644 and none) is
    the records' width or refused: a 1 152-byte BF16 row would size the host pool for another layout."""
    with pytest.raises(ValueError, match="the snapmla host pool's row is 644 bytes; got override_kv_cache_dim=1152"):
        host_pool(device_pool(), "layer_first", override_kv_cache_dim=1152)
    assert host_pool(device_pool(), "layer_first", override_kv_cache_dim=644).kv_cache_dim == 644


@pytest.mark.cpu_interpreter
def test_mtp_draft_layers_in_the_host_pool_are_refused_on_0_5_23(plugin):
    """SGLang 0.5.23 packs an MTP draft's KV layers into the target's host rows (`mtp_draft_device_pools`); the
    snapmla host pool holds none, so a server with a draft and HiCache is refused when the host pool is built."""
    if sglang_release.installed() == "0.5.17":
        pytest.skip("SGLang 0.5.17 keeps an MTP draft's KV out of the host pool")
    with pytest.raises(ValueError, match="keeps no MTP draft layers in the host pool on SGLang 0.5.23"):
        host_pool(device_pool(), "layer_first", mtp_draft_device_pools=(device_pool(),))


@pytest.mark.cpu_interpreter
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_each_layers_registered_host_memory_holds_that_layers_records(plugin, layout):
    """`data_refs` (what SGLang registers with a transfer engine, one tensor per layer, and the pointers of
    `get_contiguous_buf_infos`) views layer i's records in the per-layer layouts: after a backup, the records at the
    host slots, read through data_refs[i], are layer i's bytes."""
    from sglang_snapmla.host_pool import RECORD_BYTES, byte_views, pack

    device = device_pool()
    fill_random(device, torch.Generator().manual_seed(11))
    host = host_pool(device, layout)
    written = slots([6, 1])
    host_loc = host.alloc(len(written))
    host.backup_from_device_all_layer(device, host_loc, written, "kernel")
    assert len(host.data_refs) == LAYERS
    for layer, ref in enumerate(host.data_refs):
        records = ref.reshape(-1, RECORD_BYTES)[host_loc]
        assert torch.equal(records, pack(byte_views(*device.layer_arrays(layer)), written)), f"layer {layer}"


@pytest.mark.cpu_interpreter
def test_a_decode_context_parallel_host_pool_is_refused(plugin):
    """The record copies take host slots as they come: a host pool of one --dcp-size > 1 rank is refused (SGLang
    0.5.17 passes dcp_size to the host pool; 0.5.23's builder reads it from its parallel state)."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if sglang_release.installed() != "0.5.17":
        pytest.skip("SGLang 0.5.23 builds the host pool from its parallel state, not a dcp_size argument")
    with pytest.raises(ValueError, match="serves --dcp-size 1 only"):
        MLATokenToKVPoolHost(device_pool(), 2.0, 0, PAGE, "layer_first", pin_memory=False, device="cpu", dcp_size=2,
                             dcp_rank=0)


@pytest.mark.cpu_interpreter
def test_draft_layers_are_not_loaded(plugin):
    """SGLang 0.5.23 loads its packed MTP draft layers with is_draft=True; this pool holds none, so nothing moves."""
    device = device_pool()
    host = host_pool(device, "layer_first")
    fill_random(device, torch.Generator().manual_seed(3))
    host_loc = host.alloc(PAGE)
    host.backup_from_device_all_layer(device, host_loc, slots([2]), "kernel")
    before = [a.view(torch.uint8)[slots([6])].clone() for a in device.kv_buffer]
    host.load_to_device_per_layer(device, host_loc, slots([6]), 0, "kernel", is_draft=True)
    assert all(torch.equal(a.view(torch.uint8)[slots([6])], b) for a, b in zip(device.kv_buffer, before))


def built_with_the_default_copies(monkeypatch, caplog, device=None):
    """A host pool of `device` (a new snapmla pool by default) built with SNAPMLA_HICACHE_COPIES unset (the kernels
    asked for, after the start-up check), its fallback's once-per-process log cleared first -> (host pool, the
    warnings logged while building it)."""
    from sglang_snapmla import host_pool as hp

    monkeypatch.delenv("SNAPMLA_HICACHE_COPIES", raising=False)
    hp._fall_back.cache_clear()
    with caplog.at_level("WARNING", logger=hp.__name__):
        return host_pool(device if device is not None else device_pool(), "layer_first"), caplog.text


@pytest.mark.cpu_interpreter
def test_record_kernels_that_disagree_with_the_copies_are_not_used(plugin, monkeypatch, caplog):
    """The start-up check: a record kernel that drops the scale is caught, logged, and the torch copies serve; the
    host buffer's bytes the check used are restored."""
    from sglang_snapmla import ops

    real = ops.pool_to_records

    def scale_dropped(host_words, record_words, loc, content, scale, rope):
        real(host_words, record_words, loc, content, torch.zeros_like(scale), rope)

    monkeypatch.setattr(ops, "pool_to_records", scale_dropped)
    device = device_pool()
    host, log = built_with_the_default_copies(monkeypatch, caplog, device)
    assert host.record_copies == "torch"
    assert "wrote host records that differ from the torch copies'" in log
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
@pytest.mark.parametrize("value", ["kernel", "triton"])  # triton: what the log calls the kernels, not the setting
def test_an_unknown_copies_setting_is_refused_when_the_host_pool_is_built(plugin, monkeypatch, value):
    monkeypatch.setenv("SNAPMLA_HICACHE_COPIES", value)
    with pytest.raises(ValueError, match=f"SNAPMLA_HICACHE_COPIES='{value}': set it to 'kernels' or 'torch'"):
        host_pool(device_pool(), "layer_first")


@pytest.mark.cpu_interpreter
def test_record_kernels_that_read_back_differently_are_not_used(plugin, monkeypatch, caplog):
    """The start-up check's second half: a load kernel that drops the scale is caught and logged as well."""
    from sglang_snapmla import ops

    real = ops.records_to_pool

    def scale_dropped(host_words, record_words, loc, content, scale, rope):
        real(host_words, record_words, loc, content, scale, rope)
        scale.zero_()

    monkeypatch.setattr(ops, "records_to_pool", scale_dropped)
    host, log = built_with_the_default_copies(monkeypatch, caplog)
    assert host.record_copies == "torch"
    assert "read host records back differently from the torch copies" in log


@pytest.mark.cpu_interpreter
def test_a_device_pool_off_the_gpu_moves_pages_with_the_copies(plugin, monkeypatch, caplog):
    """Outside the interpreter's mode the record kernels need a GPU pool: a CPU one falls back, logged once."""
    from sglang_snapmla import host_pool as hp

    monkeypatch.setattr(hp, "interpreter_mode", lambda: False)
    monkeypatch.setattr(hp, "ops", None)  # the kernels are not reached
    host, log = built_with_the_default_copies(monkeypatch, caplog)
    assert host.record_copies == "torch"
    assert "the device pool is not on a GPU" in log


# ---------------------------------------------------------------------------------------------------------------
# the layer protocol: HiCache loads a prefix layer by layer on its own stream while the forward runs; each layer's
# attention waits (layer_transfer_counter.wait_until(local layer)) before it reads, the loading itself never waits
# ---------------------------------------------------------------------------------------------------------------
class RecordingCounter:
    """SGLang's LayerDoneCounter as the pool sees it (`register_layer_transfer_counter`), recording each wait."""

    def __init__(self, events):
        self.events = events

    def wait_until(self, layer):
        self.events.append(("wait", layer))


def recording(pool, monkeypatch) -> list:
    """Events of `pool` from here on: ("wait", local layer) from its counter, ("arrays", local layer) at every access
    to a layer's arrays."""
    events = []
    pool.register_layer_transfer_counter(RecordingCounter(events))
    arrays = pool.layer_arrays
    monkeypatch.setattr(pool, "layer_arrays", lambda i: events.append(("arrays", i)) or arrays(i))
    return events


STAGE_START = 2  # a pipeline stage whose first layer is global layer 2 (the pool's local layer 0)


@pytest.mark.cpu_interpreter
def test_loading_a_stages_layers_never_waits_and_lands_in_its_local_layers(plugin, monkeypatch):
    """A stage with start_layer 2: SGLang's cache controller loads local layers 0..2 (`load_to_device_per_layer(...,
    i, ...)`); each lands in that local layer's arrays, byte for byte, and no load waits on the counter (it is what
    the counter waits for)."""
    gen = torch.Generator().manual_seed(10)
    device = device_pool(start_layer=STAGE_START)
    fill_random(device, gen)
    host = host_pool(device, "layer_first")
    written = slots([5, 2])
    host_loc = host.alloc(len(written))
    host.backup_from_device_all_layer(device, host_loc, written, "kernel")
    before = device_pool(start_layer=STAGE_START)
    for name in ("kv_buffer", "kv_scale_buffer", "kv_rope_buffer"):
        for layer in range(LAYERS):
            getattr(before, name)[layer].copy_(getattr(device, name)[layer])
    fill_random(device, gen)
    events = recording(device, monkeypatch)
    loaded = slots([1, 6])
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, host_loc, loaded, layer, "kernel")
    assert not [e for e in events if e[0] == "wait"], events
    assert [i for kind, i in events if kind == "arrays"] == list(range(LAYERS))
    assert_same_rows(before, written, device, loaded)


@pytest.mark.cpu_interpreter
def test_each_layers_attention_waits_for_that_layer_before_reading(plugin, monkeypatch):
    """A stage with start_layer 2 under HiCache: for each of its layers (global ids 2..4), the decode, the absorbed
    extend, the MHA prefill's prefix fetch and the K-append wait for that layer (local index) before they touch its
    arrays; the decode reads that layer (its output against the spec on that layer's rows)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from helpers import assert_close
    from sglang_snapmla import numerics as nx
    from sglang_snapmla.backend import SnapMLAForward

    gen = torch.Generator().manual_seed(11)
    heads, scale = 8, 576 ** -0.5
    device = device_pool(start_layer=STAGE_START)
    backend = SnapMLAForward()
    backend.token_to_kv_pool, backend.max_pages, backend.num_q_heads = device, 4, heads
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    backend.req_to_token = (table.long()[:, :, None] * PAGE + torch.arange(PAGE)).reshape(1, -1).to(torch.int32)
    backend.forward_metadata = SimpleNamespace(block_kv_indices=table, seq_lens_k=None)
    rows = backend.req_to_token[0, :100].long()
    for g in range(STAGE_START, STAGE_START + LAYERS):  # each layer its own latents
        device.set_mla_kv_buffer(SimpleNamespace(layer_id=g), rows,
                                 torch.randn(100, 1, 512, generator=gen).to(torch.bfloat16),
                                 torch.randn(100, 1, 64, generator=gen).to(torch.bfloat16))
    events = recording(device, monkeypatch)
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=1, seq_lens=torch.tensor([100]),
                             out_cache_loc=None)
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, out_cache_loc=rows[96:], extend_seq_lens_cpu=[4],
                             seq_lens_cpu=torch.tensor([100]), req_pool_indices=torch.tensor([0]))
    for g in range(STAGE_START, STAGE_START + LAYERS):
        local, layer = g - STAGE_START, SimpleNamespace(layer_id=g, tp_q_head_num=heads, scaling=scale)
        start = len(events)
        q = torch.randn(1, heads, 512, generator=gen).to(torch.bfloat16)
        qr = torch.randn(1, heads, 64, generator=gen).to(torch.bfloat16)
        backend.plan_step(decode)
        out = backend.forward_decode(q, None, None, layer, decode, save_kv_cache=False, q_rope=qr)
        ref, _ = nx.snapmla_decode_reference(nx.quantize_q(q.unsqueeze(0), qr.unsqueeze(0)),
                                             nx.LatentCache(*device.kv_buffer[local:local + 1],
                                                            *device.kv_scale_buffer[local:local + 1],
                                                            *device.kv_rope_buffer[local:local + 1]),
                                             table, torch.tensor([100], dtype=torch.int32), scale)
        assert_close(out.float().view(1, 1, heads, 512), ref, rel_l2=1e-2, what=f"layer {g}")
        backend.plan_step(extend)
        backend.forward_extend(q.expand(4, -1, -1), torch.randn(4, 1, 512, generator=gen).to(torch.bfloat16),
                               None, layer, extend, save_kv_cache=True, q_rope=qr.expand(4, -1, -1),
                               k_rope=torch.randn(4, 1, 64, generator=gen).to(torch.bfloat16))
        device.get_mla_kv_buffer(layer, rows[:64])
        touched = events[start:]
        assert {i for kind, i in touched if kind == "arrays"} == {local}, touched
        for n, (kind, i) in enumerate(touched):
            if kind == "arrays":
                assert ("wait", local) in touched[:n], f"layer {g}: its arrays read before waiting ({touched})"
