// Does compute-sanitizer's racecheck order shared-memory accesses across a CTA barrier (__syncthreads) that two
// warp-specialized branches reach at different program counters, when one branch also syncs its warpgroup on a named
// barrier (bar.sync id, 128)? (GPU host; standalone, no torch.)
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/rc_probe tools/kernel_dev/racecheck_barrier_probe.cu
//   for v in named plain; do compute-sanitizer --tool racecheck /tmp/rc_probe $v; done
// The decode's narrow kernel has this shape: its softmax warpgroup reduces each page's row maxima over its 4 warps
// through shared memory behind `bar.sync 3, 128`, stores the row scales from warp 0 and reaches the CTA barrier; the
// two PV warpgroups (`bar.sync 1|2, 128` per page) reach it in their own branch and read the scales. The 64-row kernel
// has no named barrier in its softmax warpgroup. Here warpgroup 0 does the same (with "named": its per-page
// reduction behind bar.sync 3; "plain": the same loop in registers only); warpgroups 1 and 2 sync per page on
// barriers 1 and 2, then read the scales after the CTA barrier. Every read follows the write it reads through that
// barrier; the outputs are checked on the host.
#include <cstdio>
#include <cstring>

template <int kId, int kCount>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

constexpr int kPages = 8;

template <bool kNamed>
__global__ void __launch_bounds__(384, 1) probe(float* out) {
  __shared__ float red[2][4 * 4];  // per page parity: 4 warps x 4 rows
  __shared__ float rows[4];
  const int t = threadIdx.x, wg = t / 128, tw = t % 128, warp = tw / 32, lane = tw % 32;
  if (wg == 0) {
    float acc = 0.f;
    for (int p = 0; p < kPages; ++p) {
      if constexpr (kNamed) {  // the row maximum over the 4 warps, as the narrow kernel's softmax does per page
        if (lane < 4) red[p & 1][warp * 4 + lane] = float(p + warp);
        bar_sync<3, 128>();
        acc += fmaxf(fmaxf(red[p & 1][lane % 4], red[p & 1][4 + lane % 4]),
                     fmaxf(red[p & 1][8 + lane % 4], red[p & 1][12 + lane % 4]));
      } else {
        acc += float(p + 3);
      }
    }
    if (warp == 0) {  // warp 0 stores, the whole warp reconverges, then the CTA barrier publishes
      if (lane < 4) rows[lane] = acc + lane;
      __syncwarp();
    }
    __syncthreads();
  } else {
    for (int p = 0; p < kPages; ++p) {
      if (wg == 1) bar_sync<1, 128>();
      else bar_sync<2, 128>();
    }
    __syncthreads();
    out[blockIdx.x * 256 + t - 128] = rows[lane % 4];
  }
}

int main(int argc, char** argv) {
  const bool named = argc > 1 && strcmp(argv[1], "named") == 0;
  const int blocks = 4, n = blocks * 256;
  float* d;
  cudaMalloc(&d, n * sizeof(float));
  if (named) probe<true><<<blocks, 384>>>(d);
  else probe<false><<<blocks, 384>>>(d);
  float h[blocks * 256];
  cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  const float want0 = kPages * 3 + kPages * (kPages - 1) / 2;  // the sum over pages of (p + 3), either way
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += h[i] != want0 + (i % 32) % 4;
  printf("%s: %d of %d outputs wrong (%s)\n", named ? "named" : "plain", bad, n, cudaGetErrorString(cudaGetLastError()));
  return bad != 0;
}
