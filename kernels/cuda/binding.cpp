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
// Everything but Q: the pool, the paging, the outputs and the launch's scalars, checked.
static snapmla::DecodeParams common_params(torch::Tensor kv_content, torch::Tensor kv_scale, torch::Tensor kv_rope,
                                           torch::Tensor block_table, torch::Tensor seq_lens, torch::Tensor o_part,
                                           torch::Tensor lse_part, torch::Tensor out, torch::Tensor lse_out,
                                           int64_t batch, int64_t R, int64_t H, int64_t S_Q, double qk_scale_log2,
                                           int64_t num_splits, int64_t bt_entries, int64_t launch_flags) {
  for (const auto& t : {kv_content, kv_scale, kv_rope, o_part, lse_part, out, lse_out})
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
  p.batch = static_cast<int32_t>(batch);
  p.R = static_cast<int32_t>(R);
  p.H = static_cast<int32_t>(H);
  p.S_Q = static_cast<int32_t>(S_Q);
  p.num_splits = static_cast<int32_t>(num_splits);
  p.part_slots = static_cast<int32_t>(part_slots);
  p.launch_flags = static_cast<int32_t>(launch_flags);
  p.qk_scale_log2 = static_cast<float>(qk_scale_log2);
  return p;
}

static void launch(const snapmla::DecodeParams& p) {
  auto err = snapmla::launch_decode_split_sm90(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "snapmla sm90 decode launch failed: ", cudaGetErrorString(err),
              err == cudaErrorInvalidValue ? " (TMA descriptor encoding failed: the pool arrays, q8, q_rope and "
                                             "out must be 16-byte aligned; or bf16 Q for fewer than 33 query rows)"
                                           : "");
}

// Q quantized (ops.quantize_q): q8 [B, s_q, H, 512] fp8, q_scale [B, s_q, H] fp32, q_rope [B, s_q, H, 64] bf16
void decode_split(torch::Tensor q8, torch::Tensor q_scale, torch::Tensor q_rope, torch::Tensor kv_content,
                  torch::Tensor kv_scale, torch::Tensor kv_rope, torch::Tensor block_table, torch::Tensor seq_lens,
                  torch::Tensor o_part, torch::Tensor lse_part, torch::Tensor out, torch::Tensor lse_out, int64_t R,
                  int64_t H, int64_t S_Q, double qk_scale_log2, int64_t num_splits, int64_t bt_entries,
                  int64_t launch_flags) {
  for (const auto& t : {q8, q_scale, q_rope})
    TORCH_CHECK(t.is_cuda() && t.is_contiguous(), "snapmla sm90 decode: CUDA, contiguous tensors expected");
  auto p = common_params(kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse_out,
                         q8.size(0), R, H, S_Q, qk_scale_log2, num_splits, bt_entries, launch_flags);
  p.q8 = q8.data_ptr();
  p.q_scale = q_scale.data_ptr<float>();
  p.q_rope = q_rope.data_ptr();
  launch(p);
}

// Q as bf16 rows, quantized by the kernel (R = S_Q x H > 32): q_nope [B x S_Q, H, 512], q_pe [B x S_Q, H, 64], any
// strides on the first two dims, the last one contiguous; q_nope rows 16-byte aligned, q_pe rows 4-byte aligned
void decode_split_q_bf16(torch::Tensor q_nope, torch::Tensor q_pe, torch::Tensor kv_content, torch::Tensor kv_scale,
                         torch::Tensor kv_rope, torch::Tensor block_table, torch::Tensor seq_lens,
                         torch::Tensor o_part, torch::Tensor lse_part, torch::Tensor out, torch::Tensor lse_out,
                         int64_t R, int64_t H, int64_t S_Q, double qk_scale_log2, int64_t num_splits,
                         int64_t bt_entries, int64_t launch_flags) {
  TORCH_CHECK(q_nope.is_cuda() && q_pe.is_cuda() && q_nope.scalar_type() == torch::kBFloat16 &&
                  q_pe.scalar_type() == torch::kBFloat16 && q_nope.dim() == 3 && q_pe.dim() == 3 &&
                  q_nope.size(2) == 512 && q_pe.size(2) == 64 && q_nope.stride(2) == 1 && q_pe.stride(2) == 1 &&
                  q_nope.size(0) == q_pe.size(0) && q_nope.size(1) == H && q_pe.size(1) == H && S_Q > 0 &&
                  q_nope.size(0) % S_Q == 0,
              "snapmla sm90 decode: q_nope [B x s_q, H, 512] and q_pe [B x s_q, H, 64] bf16 on CUDA, last dim "
              "contiguous");
  const auto addr = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
  TORCH_CHECK(addr(q_nope) % 16 == 0 && q_nope.stride(0) % 8 == 0 && q_nope.stride(1) % 8 == 0 &&
                  addr(q_pe) % 4 == 0 && q_pe.stride(0) % 2 == 0 && q_pe.stride(1) % 2 == 0,
              "snapmla sm90 decode: q_nope rows must be 16-byte aligned and q_pe rows 4-byte aligned");
  auto p = common_params(kv_content, kv_scale, kv_rope, block_table, seq_lens, o_part, lse_part, out, lse_out,
                         q_nope.size(0) / S_Q, R, H, S_Q, qk_scale_log2, num_splits, bt_entries, launch_flags);
  p.q_nope = q_nope.data_ptr();
  p.q_pe = q_pe.data_ptr();
  p.stride_qn_t = q_nope.stride(0);
  p.stride_qn_h = q_nope.stride(1);
  p.stride_qp_t = q_pe.stride(0);
  p.stride_qp_h = q_pe.stride(1);
  launch(p);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_split", &decode_split,
        "SnapMLA split-KV decode, sm_90a (split partials for the combine, or final outputs with one split)");
  m.def("decode_split_q_bf16", &decode_split_q_bf16,
        "the same from bf16 Q rows, which the 64-row kernel quantizes itself (more than 32 query rows)");
}
