// C entry point of the sm_90a split decode for the prebuilt shared library (sglang_snapmla/prebuilt.py loads it with
// ctypes): no torch, no pybind, the CUDA runtime linked statically, so the library needs neither nvcc nor a matching
// torch where it serves, only a driver for the CUDA release that built it. The torch binding (binding.cpp) is the
// build-at-first-use path of the same launcher.
#include "snapmla_decode_sm90.h"

extern "C" {

// Arguments as snapmla::launch_decode_split_sm90 (snapmla_decode_sm90.h); `stream` is the caller's cudaStream_t
// (torch's current stream). Returns the cudaError_t of the launch as an int (0: success).
int snapmla_decode_split_sm90(const void* q8, const float* q_scale, const void* q_rope, const void* kv_content,
                              const float* kv_scale, const void* kv_rope, int64_t pool_rows, const int* block_table,
                              const int* seq_lens, float* o_part, float* lse_part, void* out, float* lse_out,
                              int batch, int stride_bt, int64_t bt_entries, int R, int H, int S_Q, float qk_scale_log2,
                              int num_splits, int part_slots, int launch_flags, void* stream) {
  return static_cast<int>(snapmla::launch_decode_split_sm90(
      q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, pool_rows, block_table, seq_lens, o_part, lse_part, out,
      lse_out, batch, stride_bt, bt_entries, R, H, S_Q, qk_scale_log2, num_splits, part_slots, launch_flags,
      static_cast<cudaStream_t>(stream)));
}

const char* snapmla_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
