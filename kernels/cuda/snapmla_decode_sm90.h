// The sm_90a SnapMLA split decode's host interface: the launcher (snapmla_decode_sm90.cu), its parameters and launch
// flags, shared by the kernel's file, the torch binding (binding.cpp), the prebuilt library's C entry point
// (c_api.cu) and, through ops.CUDA_LAUNCH_FLAGS and prebuilt.DecodeParams (both checked against this file by
// tests/product/test_kernels.py and test_prebuilt.py), the Python side. Torch-free, so the kernel compiles alone.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace snapmla {

// launch_flags bits
constexpr int kLaunchPdl = 1;           // programmatic dependent launch after the previous kernel on the stream
constexpr int kLaunchKvBeforeWait = 2;  // the previous kernel is the Q quantization: the lengths, the block table and
                                        // the first pages may be read before waiting for it (the kernel's prologue)

// One launch of the split decode: what the torch binding (binding.cpp) and the prebuilt library's C entry point
// (c_api.cu, filled by sglang_snapmla/prebuilt.py through ctypes, which mirrors this layout field by field; a test
// compares the two and the library reports sizeof to its loader) hand the launcher. Pointers are device pointers of
// contiguous arrays:
//   q8 [batch, R, 512] fp8, q_scale [batch, R] fp32, q_rope [batch, R, 64] bf16 (R = S_Q x H query rows), or
//   (the 64-row kernel, R > 32; q8, q_scale and q_rope unused) the kernel quantizes Q itself from q_nope [T, H, 512]
//   and q_pe [T, H, 64] bf16 (T = batch x S_Q; element strides stride_qn_t / _h, stride_qp_t / _h, last dims
//   contiguous, q_nope rows 16-byte and q_pe rows 4-byte aligned); never with kLaunchKvBeforeWait
//   kv_content [pool_rows, 512] fp8, kv_scale [pool_rows] fp32, kv_rope [pool_rows, 64] bf16 (the pool of one layer)
//   block_table: row b at block_table + b x stride_bt, int32 page ids; bt_entries = int32 entries from block_table
//     to the end of its allocation (the bound of every block-table read, never the caller's view width)
//   seq_lens [batch] int32
//   either o_part [batch, R, part_slots, 512] fp32 + lse_part [batch, R, part_slots] (base 2; split s of row r in
//   slot s, slots from num_splits on untouched), with out = lse_out = nullptr, or (num_splits == 1)
//   out [batch, R, 512] bf16 + lse_out [batch, H, S_Q] (natural log), with the partials nullptr.
//   qk_scale_log2: the softmax scale x log2(e); launch_flags: kLaunchPdl | kLaunchKvBeforeWait.
struct DecodeParams {
  const void* q8;
  const float* q_scale;
  const void* q_rope;
  const void* q_nope;
  const void* q_pe;
  const void* kv_content;
  const float* kv_scale;
  const void* kv_rope;
  const int* block_table;
  const int* seq_lens;
  float* o_part;
  float* lse_part;
  void* out;
  float* lse_out;
  int64_t pool_rows;
  int64_t bt_entries;
  int64_t stride_qn_t;
  int64_t stride_qn_h;
  int64_t stride_qp_t;
  int64_t stride_qp_h;
  int32_t stride_bt;
  int32_t batch;
  int32_t R;
  int32_t H;
  int32_t S_Q;
  int32_t num_splits;
  int32_t part_slots;
  int32_t launch_flags;
  float qk_scale_log2;
};

// Returns the launch's error (cudaErrorInvalidConfiguration: outputs that do not fit num_splits;
// cudaErrorInvalidValue: a TMA descriptor could not be encoded, or q_nope where the kernel cannot take it).
cudaError_t launch_decode_split_sm90(const DecodeParams& p, cudaStream_t stream);

}  // namespace snapmla
