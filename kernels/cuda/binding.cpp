// Torch binding of the sm_90a SnapMLA split decode (the kernel and its launcher live in snapmla_decode_sm90.cu).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "snapmla_decode_sm90.h"

// Shapes and dtypes are validated by sglang_snapmla.ops.decode_quantized before this is called; here only what the
// kernel's address arithmetic relies on is re-checked.
// Either o_part / lse_part (split partials for the combine; out and lse_out empty) or, with num_splits == 1, out
// [B, s_q, H, 512] bf16 / lse_out [B, H, s_q] fp32 (final outputs; o_part and lse_part empty).
// launch_flags: snapmla::kLaunchPdl | snapmla::kLaunchKvBeforeWait (snapmla_decode_sm90.h; without kLaunchPdl the
// kernel's wait is a no-op and the previous kernel has completed anyway).
void decode_split(torch::Tensor q8, torch::Tensor q_scale, torch::Tensor q_rope, torch::Tensor kv_content,
                  torch::Tensor kv_scale, torch::Tensor kv_rope, torch::Tensor block_table, torch::Tensor seq_lens,
                  torch::Tensor o_part, torch::Tensor lse_part, torch::Tensor out, torch::Tensor lse_out, int64_t R,
                  int64_t H, int64_t S_Q, double qk_scale_log2, int64_t num_splits, int64_t bt_entries,
                  int64_t launch_flags) {
  for (const auto& t : {q8, q_scale, q_rope, kv_content, kv_scale, kv_rope, o_part, lse_part, out, lse_out})
    TORCH_CHECK(t.is_cuda() && t.is_contiguous(), "snapmla sm90 decode: CUDA, contiguous tensors expected");
  const bool final_out = out.numel() > 0;
  TORCH_CHECK(!final_out || (num_splits == 1 && lse_out.numel() > 0 && out.scalar_type() == torch::kBFloat16 &&
                             lse_out.scalar_type() == torch::kFloat32),
              "snapmla sm90 decode: final outputs (bf16 out, fp32 lse) only with num_splits == 1");
  TORCH_CHECK(final_out || (o_part.numel() > 0 && lse_part.numel() > 0),
              "snapmla sm90 decode: pass either the split partials or the final outputs");
  // partials [B, R, slots, 512] / [B, R, slots]: split s of a row in slot s; slots >= num_splits (decode_plan.partial_slots)
  const int64_t part_slots = final_out ? 1 : o_part.size(2);
  TORCH_CHECK(final_out || (o_part.dim() == 4 && lse_part.dim() == 3 && lse_part.size(2) == part_slots &&
                            part_slots >= num_splits),
              "snapmla sm90 decode: o_part [B, R, slots, 512] and lse_part [B, R, slots] with slots >= num_splits");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && block_table.stride(1) == 1,
              "block_table must be int32 with unit stride in its last dim");
  // bt_entries: int32 entries from the table's first element to the end of its storage (ops.block_table_entries).
  // The kernel bounds its block-table reads by it, never by this view's width: a CUDA graph captured with a
  // narrowed view (SGLang's capture passes width 1) replays with longer sequences over the same storage.
  TORCH_CHECK(bt_entries >= 0 && bt_entries <= static_cast<int64_t>(block_table.storage().nbytes() / sizeof(int)) -
                                                   block_table.storage_offset(),
              "snapmla sm90 decode: bt_entries exceeds the block table's storage");
  snapmla::DecodeParams p = {};
  p.q8 = q8.data_ptr();
  p.q_scale = q_scale.data_ptr<float>();
  p.q_rope = q_rope.data_ptr();
  p.kv_content = kv_content.data_ptr();
  p.kv_scale = kv_scale.data_ptr<float>();
  p.kv_rope = kv_rope.data_ptr();
  p.block_table = block_table.data_ptr<int>();
  p.seq_lens = seq_lens.data_ptr<int>();
  p.o_part = final_out ? nullptr : o_part.data_ptr<float>();
  p.lse_part = final_out ? nullptr : lse_part.data_ptr<float>();
  p.out = final_out ? out.data_ptr() : nullptr;
  p.lse_out = final_out ? lse_out.data_ptr<float>() : nullptr;
  p.pool_rows = kv_content.size(0);
  p.bt_entries = bt_entries;
  p.stride_bt = static_cast<int32_t>(block_table.stride(0));
  p.batch = static_cast<int32_t>(q8.size(0));
  p.R = static_cast<int32_t>(R);
  p.H = static_cast<int32_t>(H);
  p.S_Q = static_cast<int32_t>(S_Q);
  p.num_splits = static_cast<int32_t>(num_splits);
  p.part_slots = static_cast<int32_t>(part_slots);
  p.launch_flags = static_cast<int32_t>(launch_flags);
  p.qk_scale_log2 = static_cast<float>(qk_scale_log2);
  auto err = snapmla::launch_decode_split_sm90(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "snapmla sm90 decode launch failed: ", cudaGetErrorString(err),
              err == cudaErrorInvalidValue ? " (TMA descriptor encoding failed: the pool arrays, q8, q_rope and "
                                             "out must be 16-byte aligned)" : "");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_split", &decode_split,
        "SnapMLA split-KV decode, sm_90a (split partials for the combine, or final outputs with one split)");
}
