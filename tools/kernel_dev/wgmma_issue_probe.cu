// How long does a warpgroup spend *issuing* the decode's QK (16 FP8 m64n64k32 + 4 BF16 m64n64k16 WGMMAs), and does
// the issue wait for the tensor pipe? (GPU host; standalone, no torch.)
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe tools/kernel_dev/wgmma_issue_probe.cu && /tmp/probe
// A profile of the decode puts ~26 % of the softmax warp's time in the QK issue, ~720 cycles per
// page against ~640 cycles of tensor work for that QK. If issuing an RS (A from registers) or SS WGMMA blocks until
// the tensor pipe takes it, the warp that owns the scores cannot run its softmax while its next QK executes, which
// is the decode's whole schedule. One CTA of three warpgroups per SM, as in the decode; warpgroup 0 issues QK and reads
// clock64 after the issue and after the wait; in the "busy" runs warpgroups 1 and 2 keep the tensor pipe loaded
// with PV-sized WGMMAs (m64n256k32, 2 each) issued just before. Shared memory holds zeros (timing only).
#include <cstdio>
#include <vector>
#include <algorithm>

#include "../../kernels/cuda/snapmla_decode_sm90.cu"

using namespace snapmla;

constexpr int kReps = 64;

template <bool kRs, bool kBusy>
__global__ void __launch_bounds__(384, 1) probe(long long* out) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < 160 * 1024 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0;
  fence_async_smem();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  uint8_t* q = smem;                // 5 tiles: Q (SS variant)
  uint8_t* k = smem + 5 * kTile;    // 5 tiles: K page
  uint8_t* v = smem + 10 * kTile;   // V^T-sized operand for the PV warpgroups
  // accumulators and fragments live inside their warpgroup's branch only, so that ptxas fits each branch in the
  // launch's 168 registers (otherwise it serializes every WGMMA, C7512)
  for (int rep = 0; rep < kReps; ++rep) {
    __syncthreads();
    if (wg > 0) {
      if (kBusy) {
        float o[128];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
          wgmma_m64n256k32_e4m3(o, smem_desc(v, 1024) + kk * 2, smem_desc(v + 4096, 1024), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        if (o[0] == 12345.f) out[0] = -1;  // keeps the accumulators alive
      }
      continue;
    }
    float s[32];
    uint32_t qf[20][4];
#pragma unroll
    for (int i = 0; i < 20; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) qf[i][j] = static_cast<uint32_t>(rep) & 0u;
    if (kBusy) __nanosleep(200);  // let the PV warpgroups' WGMMAs reach the pipe first
    const uint64_t desc_k = smem_desc_sw128(k), desc_q = smem_desc_sw128(q);
    long long t_at[4];  // after WGMMA 4, 8, 12, 16: how many the warp issues before it has to wait
    const long long t0 = clock64();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      const uint64_t off = ((kk / 4) * kTile + (kk % 4) * 32) >> 4;
      if (kRs) wgmma_m64n64k32_e4m3_rs(s, qf[kk], desc_k + off, kk > 0);
      else wgmma_m64n64k32_e4m3(s, desc_q + off, desc_k + off, kk > 0);
      if (kk % 4 == 3) t_at[kk / 4] = clock64();
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t off = (4 * kTile + kk * 32) >> 4;
      if (kRs) wgmma_m64n64k16_bf16_rs(s, qf[16 + kk], desc_k + off, 1);
      else wgmma_m64n64k16_bf16(s, desc_q + off, desc_k + off, 1);
    }
    wgmma_commit();
    const long long t1 = clock64();
    wgmma_wait<0>();
    const long long t2 = clock64();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
      out[6 * rep] = t1 - t0;
      out[6 * rep + 1] = t2 - t0;
      for (int i = 0; i < 4; ++i) out[6 * rep + 2 + i] = t_at[i] - t0;
    }
    if (s[0] == 12345.f) out[1] = -1;  // keeps the accumulators alive
  }
}

template <bool kRs, bool kBusy>
void run(const char* name) {
  long long* d;
  cudaMalloc(&d, 6 * kReps * sizeof(long long));
  const int smem = 160 * 1024 + 1024;
  cudaFuncSetAttribute(probe<kRs, kBusy>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<kRs, kBusy><<<132, 384, smem>>>(d);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("%s: %s\n", name, cudaGetErrorString(e)); return; }
  std::vector<long long> h(6 * kReps);
  cudaMemcpy(h.data(), d, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  auto median = [&](int field) {
    std::vector<long long> v;
    for (int r = 8; r < kReps; ++r) v.push_back(h[6 * r + field]);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  printf("| %s | %lld | %lld | %lld | %lld | %lld | %lld |\n", name, median(2), median(3), median(4), median(5),
         median(0), median(1));
  cudaFree(d);
}

int main() {
  printf("QK of one page (16 x m64n64k32 e4m3 + 4 x m64n64k16 bf16), clock64 cycles from the first WGMMA, medians "
         "of %d repetitions\n| variant | 4 issued | 8 issued | 12 issued | 16 issued | all 20 issued + commit | "
         "wait_group 0 returns |\n|---|---:|---:|---:|---:|---:|---:|\n", kReps - 8);
  run<true, false>("A from registers (RS), idle pipe");
  run<false, false>("A from shared memory (SS), idle pipe");
  run<true, true>("RS, 2 x PV WGMMAs queued by two other warpgroups");
  run<false, true>("SS, 2 x PV WGMMAs queued by two other warpgroups");
  return 0;
}
