// The sm_90a SnapMLA split decode's host interface: the launcher (snapmla_decode_sm90.cu) and its launch flags,
// shared by the kernel's file, the torch binding (binding.cpp) and, through ops.CUDA_LAUNCH_FLAGS (checked against
// this file by tests/product/test_kernels.py), the Python dispatch. Torch-free, so the kernel compiles on its own.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace snapmla {

// launch_flags bits
constexpr int kLaunchPdl = 1;           // programmatic dependent launch after the previous kernel on the stream
constexpr int kLaunchKvBeforeWait = 2;  // the previous kernel is the Q quantization: the lengths, the block table and
                                        // the first pages may be read before waiting for it (the kernel's prologue)

// One launch of the split decode. Pointers are device pointers of contiguous arrays:
//   q8 [batch, R, 512] fp8, q_scale [batch, R] fp32, q_rope [batch, R, 64] bf16 (R = S_Q x H query rows)
//   kv_content [pool_rows, 512] fp8, kv_scale [pool_rows] fp32, kv_rope [pool_rows, 64] bf16 (the pool of one layer)
//   block_table: row b at block_table + b x stride_bt, int32 page ids; bt_entries = int32 entries from block_table
//     to the end of its allocation (the bound of every block-table read, never the caller's view width)
//   seq_lens [batch] int32
//   either o_part [batch, R, part_slots, 512] fp32 + lse_part [batch, R, part_slots] (base 2; split s of row r in
//   slot s, slots from num_splits on untouched), with out = lse_out = nullptr, or (num_splits == 1)
//   out [batch, R, 512] bf16 + lse_out [batch, H, S_Q] (natural log), with the partials nullptr. Returns the
//   launch's error (cudaErrorInvalidValue: a TMA descriptor could not be encoded).
cudaError_t launch_decode_split_sm90(const void* q8, const float* q_scale, const void* q_rope, const void* kv_content,
                                     const float* kv_scale, const void* kv_rope, int64_t pool_rows,
                                     const int* block_table, const int* seq_lens, float* o_part, float* lse_part,
                                     void* out, float* lse_out, int batch, int stride_bt, int64_t bt_entries, int R,
                                     int H, int S_Q, float qk_scale_log2, int num_splits, int part_slots,
                                     int launch_flags, cudaStream_t stream);

}  // namespace snapmla
