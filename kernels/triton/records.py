"""Triton kernels that move the hierarchical cache's host records (sglang_snapmla/host_pool.py) between the host pool
and the device pool's three arrays.

A record is one token of one layer, 644 bytes = 161 32-bit words: content words 0-127 (FP8 [512]), the scale at word
128 (fp32), RoPE words 129-160 (BF16 [64]). The kernels read and write the host pool in place: its buffer is page-locked
and mapped into the GPU's address space (SGLang registers it with cudaHostRegister; under unified addressing the GPU
reaches it at the host address), so a record crosses PCIe once, in a kernel on the caller's stream, as SGLang's own
transfer kernels move its 1 152-byte BF16 rows. Whole words are copied: every bit pattern, non-finite ones included,
arrives unchanged. One program per token.
"""

import triton
import triton.language as tl

CONTENT_WORDS = tl.constexpr(128)
ROPE_WORDS = tl.constexpr(32)


@triton.jit
def records_to_pool_kernel(
    host_ptr, record_word_ptr,  # host pool as int32 words; [n] int64: the word offset of each record
    loc_ptr,  # [n] int64 device slots
    content_ptr, scale_ptr, rope_ptr,  # one layer's arrays as int32 words: [N, 128], [N], [N, 32] (row strides given)
    stride_c, stride_r,
):
    i = tl.program_id(0).to(tl.int64)
    src = tl.load(record_word_ptr + i)
    slot = tl.load(loc_ptr + i).to(tl.int64)
    wc = tl.arange(0, CONTENT_WORDS)
    wr = tl.arange(0, ROPE_WORDS)
    tl.store(content_ptr + slot * stride_c + wc, tl.load(host_ptr + src + wc))
    tl.store(scale_ptr + slot, tl.load(host_ptr + src + CONTENT_WORDS))
    tl.store(rope_ptr + slot * stride_r + wr, tl.load(host_ptr + src + CONTENT_WORDS + 1 + wr))


@triton.jit
def pool_to_records_kernel(
    host_ptr, record_word_ptr,  # as above: the records written
    loc_ptr,  # [n] int64 device slots read
    content_ptr, scale_ptr, rope_ptr,
    stride_c, stride_r,
):
    i = tl.program_id(0).to(tl.int64)
    dst = tl.load(record_word_ptr + i)
    slot = tl.load(loc_ptr + i).to(tl.int64)
    wc = tl.arange(0, CONTENT_WORDS)
    wr = tl.arange(0, ROPE_WORDS)
    tl.store(host_ptr + dst + wc, tl.load(content_ptr + slot * stride_c + wc))
    tl.store(host_ptr + dst + CONTENT_WORDS, tl.load(scale_ptr + slot))
    tl.store(host_ptr + dst + CONTENT_WORDS + 1 + wr, tl.load(rope_ptr + slot * stride_r + wr))
