// SnapMLA split-KV decode for Hopper (sm_90a): FP8 WGMMA for content QK and PV, BF16 WGMMA for RoPE QK.
//
// Version 3 (v2b = tag cuda-decode-v2b-validated, v1 = tag cuda-decode-v1-validated, v0 = b468437). One CTA = 64
// query rows (flattened (token, head) pairs of one sequence) x one split of its 64-token pages, two warpgroups.
//   pages arrive by TMA (one thread issues 4 content boxes + 1 RoPE box + a 256 B bulk copy of the scales per page)
//   into two stages of 128 B-swizzled K-major tiles, completion on one mbarrier per stage.
//   step p (FlashAttention-3 order: the tensor cores run PV(p - 1) while page p's softmax and transpose run):
//     both            : O *= f(p - 1); warpgroup 0 issues QK(p), then each warpgroup issues its half of PV(p - 1)
//     warpgroup 0     : waits for QK(p) only: S = Q8 K8^T (16 x m64n64k32 e4m3) + Q_rope' K_rope'^T (4 x m64n64k16
//                       bf16) -- one accumulation thanks to scale-domain alignment -- then S *= sigma_q sigma_k,
//                       causal mask, online softmax (base 2), P' = P * sigma_k, sigma_P = rowmax(P') / 448,
//                       P8(p) = fp8(P' / sigma_P) and f(p) into the double-buffered slots of page p
//     warpgroup 1     : V^T(p) = transpose of the staged fp8 page into a K-major [512 x 64] tile (FP8 WGMMA reads
//                       both operands K-major, so PV cannot read the page as stored); tokens past the sequence end
//                       become zeros (a partial last page holds stale pool bytes, possibly NaN patterns)
//     then            : thread 0 refills page p's stage with page p + 2 (named barrier: QK and transpose are done)
// O is kept in the scale of the current page's P: with O_true = O * s, a page with (alpha, sigma_P) gives
// O' = O * (alpha * s / sigma_P) + P8 V and s' = sigma_P, so no second accumulator is needed. PV accumulates pages
// in strictly increasing order (no inverted order: it breaks with per-block P scales).
// Q and K tiles use WGMMA's 128 B-swizzle K-major layout (8 rows x 128 B atoms, 16 B chunks XOR-ed with row % 8,
// 1024 B aligned; a 512 B content row is four such tiles side by side); V^T and P8, written by threads, use the
// no-swizzle K-major layout (8-row x 16-byte core matrices).
// Outputs are the same split partials as the Triton split kernel (o_part fp32, base-2 LSE), merged by its combine.

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>
#include <cstdint>

#include "wgmma_ops.cuh"

namespace snapmla {

constexpr int kLatent = 512, kRope = 64, kPage = 64, kRows = 64, kThreads = 256, kStages = 2;
constexpr float kFp8Max = 448.f;

// shared memory map (bytes, from a 1024 B aligned base: swizzled tiles need 1024 B alignment)
constexpr int kTile = kPage * 128;                    // one [64 rows x 128 B] swizzled tile, 8 KB
constexpr int kStageBytes = 5 * kTile + kPage * 4;    // 4 content tiles, 1 RoPE tile, 64 fp32 scales
constexpr int kQ8 = 0;                                // 4 tiles [64 rows x 128 B]
constexpr int kQR = kQ8 + 4 * kTile;                  // 1 tile [64 rows x 64 bf16]
constexpr int kStage0 = kQR + kTile;                  // kStages x kStageBytes (padded to 1024 B)
constexpr int kStagePitch = (kStageBytes + 1023) / 1024 * 1024;
constexpr int kVT = kStage0 + kStages * kStagePitch;  // 2 x [512 latent x 64 B] fp8 (V^T of pages p, p - 1)
constexpr int kP8 = kVT + 2 * kLatent * kPage;        // 2 x [64 rows x 64 B] fp8
constexpr int kRowF = kP8 + 2 * kRows * kPage;        // 2 x [64] fp32 per-row O rescale factor
constexpr int kRowS = kRowF + 2 * kRows * 4;          // [64] fp32 final scale s / l
constexpr int kRowL = kRowS + kRows * 4;              // [64] fp32 final base-2 LSE
constexpr int kBar = kRowL + kRows * 4;               // kStages x 8 B mbarriers
constexpr int kSmemBytes = kBar + kStages * 8 + 1024;  // + 1024: slack to align the base (~197 KB in all)
static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-CTA limit");

// byte offset of (row, byte) in a run of 128 B-swizzled tiles holding rows of `row_bytes` (a multiple of 128)
__device__ __forceinline__ int sw128(int row, int byte) {
  return (byte >> 7) * kTile + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15);
}

__device__ __forceinline__ int kmajor(int row, int byte, int row_bytes) {
  return (row >> 3) * (row_bytes / 16) * 128 + (byte >> 4) * 128 + (row & 7) * 16 + (byte & 15);
}

__device__ __forceinline__ uint64_t smem_desc(const uint8_t* p, int stride_byte_offset) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)(128 >> 4) << 16;                        // leading byte offset: next core matrix along K
  d |= (uint64_t)((stride_byte_offset & 0x3FFFF) >> 4) << 32;  // stride byte offset: next 8 rows
  return d;                                               // base offset 0, swizzle mode 0 (none)
}

// K-major, 128 B swizzle: rows of 128 B, 8-row atoms 1024 B apart; stepping along K inside the 128 B row is a byte
// offset added to the start address (the hardware applies the XOR on the final address bits)
__device__ __forceinline__ uint64_t smem_desc_sw128(const uint8_t* p) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)1 << 16;                 // leading byte offset: unused for swizzled K-major
  d |= (uint64_t)(1024 >> 4) << 32;       // stride byte offset: next 8-row atom
  d |= (uint64_t)1 << 62;                 // layout: 128 B swizzle
  return d;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void cp_async16(uint8_t* dst, const void* src, bool valid) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  int n = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
template <int kPending>  // wait until at most kPending of this thread's most recent commit groups are in flight
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// all but the most recent WGMMA group done (FA3 order: QK(p) is committed before PV(p - 1))
__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Stage 64 consecutive rows of `kRowBytes` bytes from global `src` into 128 B-swizzled tiles at `dst` (16-byte
// cp.async chunks); rows at or past `valid_rows` are zero-filled (their source address is clamped, never read).
// Used once per CTA, for the Q tile.
template <int kRowBytes>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const uint8_t* src, int valid_rows) {
  constexpr int kChunks = kRowBytes / 16;
  const int last = max(valid_rows - 1, 0);
  for (int c = threadIdx.x; c < 64 * kChunks; c += kThreads) {
    int row = c / kChunks, b = (c % kChunks) * 16;
    cp_async16(dst + sw128(row, b), src + (int64_t)min(row, last) * kRowBytes + b, row < valid_rows);
  }
}

// One thread: page `page` of the pool into stage `buf` (4 content boxes, the RoPE box, the scales), all completing
// on the stage's mbarrier.
__device__ __forceinline__ void load_page(uint8_t* smem, int buf, const CUtensorMap* map_kv,
                                          const CUtensorMap* map_rope, const float* kv_scale, int64_t page) {
  uint8_t* stage = smem + kStage0 + buf * kStagePitch;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + kBar) + buf;
  mbar_expect_tx(bar, kStageBytes);
  const int row = static_cast<int>(page * kPage);
#pragma unroll
  for (int blk = 0; blk < 4; ++blk) tma_load_2d(stage + blk * kTile, map_kv, blk * 128, row, bar);
  tma_load_2d(stage + 4 * kTile, map_rope, 0, row, bar);
  bulk_load(stage + 5 * kTile, kv_scale + page * kPage, kPage * 4, bar);
}

// V^T (K-major over tokens) from the staged page, by the 128 threads of warpgroup 1 (`tw` = 0..127), in 4 x 4 byte
// blocks: four 4-byte reads (4 latent channels of one token), byte permutes, four 4-byte writes (4 tokens of one
// channel). 2048 blocks = 16 rounds of 128; in round i warp w takes the 16 B chunk column w + 4 i of the 512 B rows
// and tokens 32 (i / 8) ..+31; lane bits 0-1 pick the 4-byte word of the chunk, bits 2-4 the token block. Reads hit
// 32 distinct banks: `rot` (lane bits 3-4) rotates which of the block's 4 tokens is read first, so the tokens' low
// three bits (the swizzle's XOR) differ across the 8 lane groups; the second permute level undoes the rotation.
// All addresses are per-thread bases plus compile-time offsets (the profile of the generic index math showed the
// transpose as the longest path). Tokens at or past `valid` read as zeros (kMasked: only a sequence's last page).
template <bool kMasked>
__device__ __forceinline__ void transpose_page(uint8_t* smem, int buf, uint8_t* vt, int tw, int valid) {
  const uint8_t* k8 = smem + kStage0 + buf * kStagePitch;
  const int lane = tw % 32, warp = tw / 32, rot = (lane >> 3) & 3, word = lane & 3, tblk = lane >> 2;
  int rd[4][2];  // read offset of token a of this lane's block, for even / odd rounds (round 0 / 1 of the tile)
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int tok = tblk * 4 + ((a + rot) & 3);
#pragma unroll
    for (int e = 0; e < 2; ++e) rd[a][e] = tok * 128 + (((warp + 4 * e) ^ (tok & 7)) << 4) + word * 4;
  }
  int wr[4];  // write offset of output word c (channel 16 warp + 4 word + c, tokens 4 tblk ..+3) in round 0
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int ch = word * 4 + c;  // channel within the 16-channel group of the warp
    wr[c] = (2 * warp + (ch >> 3)) * 512 + (tblk >> 2) * 128 + (ch & 7) * 16 + (tblk & 3) * 4;
  }
  // second-level byte selectors with the rotation folded in: result byte k takes selector nibble (k - rot) & 3
  auto rotl_sel = [rot](uint32_t sel) { return ((sel << (4 * rot)) | (sel >> (16 - 4 * rot))) & 0xFFFFu; };
  const uint32_t sel_lo = rotl_sel(0x5410u), sel_hi = rotl_sel(0x7632u);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int roff = ((i % 8) / 2) * kTile + (i / 8) * 4096;  // tile (i % 8) / 2, tokens + 32 (i / 8)
    uint32_t r[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      r[a] = *reinterpret_cast<const uint32_t*>(k8 + rd[a][i & 1] + roff);
      if (kMasked) r[a] = (tblk * 4 + ((a + rot) & 3) + 32 * (i / 8)) < valid ? r[a] : 0u;
    }
    const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140), t1 = __byte_perm(r[0], r[1], 0x7362);
    const uint32_t t2 = __byte_perm(r[2], r[3], 0x5140), t3 = __byte_perm(r[2], r[3], 0x7362);
    const int woff = (i % 8) * 8 * 512 + (i / 8) * 2 * 128;  // channels + 64 (i % 8), tokens + 32 (i / 8)
    *reinterpret_cast<uint32_t*>(vt + wr[0] + woff) = __byte_perm(t0, t2, sel_lo);
    *reinterpret_cast<uint32_t*>(vt + wr[1] + woff) = __byte_perm(t0, t2, sel_hi);
    *reinterpret_cast<uint32_t*>(vt + wr[2] + woff) = __byte_perm(t1, t3, sel_lo);
    *reinterpret_cast<uint32_t*>(vt + wr[3] + woff) = __byte_perm(t1, t3, sel_hi);
  }
}

// 2^x by the SFU (ex2.approx.ftz: ~2 ulp, -inf -> 0, subnormal results flushed to 0, as softmax weights can be)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two fp8 values (RNE, saturating to +-448, the reference's to_fp8) packed for one 16-bit store: `lo` at the lower
// address.
__device__ __forceinline__ uint16_t to_fp8x2(float lo, float hi) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}

// O_g[64 x 256] += P8 V^T_g for the page in double-buffer slot `slot`, output columns of warpgroup `g` (async: the
// caller commits and waits)
__device__ __forceinline__ void issue_pv(float* o, uint8_t* smem, int slot, int g) {
  const uint8_t* p8 = smem + kP8 + slot * kRows * kPage;
  const uint8_t* vt = smem + kVT + slot * kLatent * kPage + (g * 256 / 8) * ((kPage / 16) * 128);
#pragma unroll
  for (int k = 0; k < kPage / 32; ++k)
    wgmma_m64n256k32_e4m3(o, smem_desc(p8 + k * 256, (kPage / 16) * 128), smem_desc(vt + k * 256, (kPage / 16) * 128),
                          1);
}

// One page step of the main loop (see the kernel): kHasCur = page p exists (QK, softmax, transpose), kHasPrev = PV of
// page p - 1 is due. Separate instantiations for the first, steady and drain steps keep every WGMMA on a path that
// is uniform at compile time (ptxas serializes WGMMAs issued under runtime conditions).
template <bool kHasCur, bool kHasPrev>
__device__ __forceinline__ void page_step(
    const int p, const int first, const int last, const int seq_len, uint8_t* smem, uint64_t* full,
    const CUtensorMap* map_kv, const CUtensorMap* map_rope, const float* kv_scale, const int* bt, int& next_page_id,
    float (&o)[128], float& m0, float& m1, float& l0, float& l1, float& s0, float& s1,
    const float qs0, const float qs1, const int last_key0, const int last_key1, const int grow0, const int grow1,
    const int R, const int row0, const int row1, const int t, const int wg, const int tw, const int lane) {
  float* rowf = reinterpret_cast<float*>(smem + kRowF);
  const int pb = (p - first) & 1, qb = pb ^ 1;  // double-buffer slots of page p and page p - 1
  fence_async_smem();  // P8, V^T (ordinary stores) before WGMMA reads them through the async proxy
  __syncthreads();  // P8, f and V^T of page p - 1 are complete; PV(p - 2) is done with slot pb in both groups
  const int buf = (p - first) % kStages;
  const int valid = kHasCur ? min(kPage, seq_len - p * kPage) : 0;  // tokens of page p inside the sequence
  const uint8_t* stage = smem + kStage0 + buf * kStagePitch;
  const float* ks = reinterpret_cast<const float*>(stage + 5 * kTile);
  if constexpr (kHasCur) mbar_wait(full + buf, ((p - first) / kStages) & 1);  // page p has landed

  if constexpr (kHasPrev) {  // O for page p - 1 (factors from softmax(p - 1)), before PV(p - 1) reads it
    const float g0 = rowf[qb * kRows + row0], g1 = rowf[qb * kRows + row1];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= g0;
      o[4 * j + 1] *= g0;
      o[4 * j + 2] *= g1;
      o[4 * j + 3] *= g1;
    }
  }
  float s[32];
  if constexpr (kHasCur) {
    if (wg == 0) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kLatent / 32; ++k)  // tile k / 4, 32 B step k % 4 inside its 128 B rows
        wgmma_m64n64k32_e4m3(s, smem_desc_sw128(smem + kQ8 + (k / 4) * kTile + (k % 4) * 32),
                             smem_desc_sw128(stage + (k / 4) * kTile + (k % 4) * 32), k > 0);
#pragma unroll
      for (int k = 0; k < kRope * 2 / 32; ++k)
        wgmma_m64n64k16_bf16(s, smem_desc_sw128(smem + kQR + k * 32), smem_desc_sw128(stage + 4 * kTile + k * 32),
                             1);
      wgmma_commit();
    }
  }
  if constexpr (kHasPrev) {  // both warpgroups, each its 256 output columns
    wgmma_fence();
    issue_pv(o, smem, qb, wg);
    wgmma_commit();
  }
  if constexpr (kHasCur) {  // warpgroup 0: QK(p) done, PV(p - 1) may still run (warpgroup 1: no-op / PV done)
    if constexpr (kHasPrev) wgmma_wait_one(); else wgmma_wait_all();
  }
  if (wg == 0) {
    if constexpr (kHasCur) {
      // scale, mask, online softmax (two rows per thread; a row's 64 columns live in one quad of lanes), on a copy
      // of the scores: rewriting WGMMA accumulator registers while PV(p - 1) is in flight serializes the WGMMAs
      float x[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] = s[i];
      float kscale[16];  // sigma_k of this thread's 16 columns; 0 past the sequence end (stale pool bytes there)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = j * 8 + (lane % 4) * 2;
        const float2 k2 = *reinterpret_cast<const float2*>(ks + col);
        kscale[2 * j] = col < valid ? k2.x : 0.f;
        kscale[2 * j + 1] = col + 1 < valid ? k2.y : 0.f;
      }
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int col = j * 8 + (lane % 4) * 2 + c, key = p * kPage + col;
          const float ksc = kscale[2 * j + c];
          float v0 = x[4 * j + c] * qs0 * ksc, v1 = x[4 * j + 2 + c] * qs1 * ksc;
          v0 = (key <= last_key0 && grow0 < R) ? v0 : -INFINITY;
          v1 = (key <= last_key1 && grow1 < R) ? v1 : -INFINITY;
          x[4 * j + c] = v0;
          x[4 * j + 2 + c] = v1;
          mx0 = fmaxf(mx0, v0);
          mx1 = fmaxf(mx1, v1);
        }
      }
#pragma unroll
      for (int x = 1; x < 4; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, x));
      }
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
      const float a0 = fast_exp2(m0 - ms0), a1 = fast_exp2(m1 - ms1);
      float sum0 = 0.f, sum1 = 0.f, pm0 = 0.f, pm1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float ksc = kscale[2 * j + c];
          float p0 = fast_exp2(x[4 * j + c] - ms0), p1 = fast_exp2(x[4 * j + 2 + c] - ms1);
          sum0 += p0;
          sum1 += p1;
          x[4 * j + c] = p0 * ksc;  // P' = P * sigma_k (V's per-token scale fused into P)
          x[4 * j + 2 + c] = p1 * ksc;
          pm0 = fmaxf(pm0, x[4 * j + c]);
          pm1 = fmaxf(pm1, x[4 * j + 2 + c]);
        }
      }
#pragma unroll
      for (int x = 1; x < 4; x <<= 1) {
        sum0 += __shfl_xor_sync(0xffffffff, sum0, x);
        sum1 += __shfl_xor_sync(0xffffffff, sum1, x);
        pm0 = fmaxf(pm0, __shfl_xor_sync(0xffffffff, pm0, x));
        pm1 = fmaxf(pm1, __shfl_xor_sync(0xffffffff, pm1, x));
      }
      l0 = l0 * a0 + sum0;
      l1 = l1 * a1 + sum1;
      m0 = mn0;
      m1 = mn1;
      // a row without any visible key in this page keeps its scale (its P8 is zero either way)
      const float ps0 = pm0 > 0.f ? fmaxf(pm0 / kFp8Max, 1.17549435e-38f) : s0;
      const float ps1 = pm1 > 0.f ? fmaxf(pm1 / kFp8Max, 1.17549435e-38f) : s1;
      // P8 = fp8(P' * (1 / sigma_P)): one correctly rounded reciprocal per row instead of a division per element
      // (the product is within 1 ulp of the quotient; the fp8 rounding that follows absorbs it except at exact
      // rounding ties). The row maximum maps to 448 (+-1 ulp, saturated to 448).
      const float inv0 = __frcp_rn(ps0), inv1 = __frcp_rn(ps1);
      uint8_t* p8 = smem + kP8 + pb * kRows * kPage;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = j * 8 + (lane % 4) * 2;
        *reinterpret_cast<uint16_t*>(p8 + kmajor(row0, col, kPage)) = to_fp8x2(x[4 * j] * inv0, x[4 * j + 1] * inv0);
        *reinterpret_cast<uint16_t*>(p8 + kmajor(row1, col, kPage)) =
            to_fp8x2(x[4 * j + 2] * inv1, x[4 * j + 3] * inv1);
      }
      if (lane % 4 == 0) {  // O's rescale factors for page p, applied by both warpgroups before PV(p)
        rowf[pb * kRows + row0] = a0 * s0 * inv0;
        rowf[pb * kRows + row1] = a1 * s1 * inv1;
      }
      s0 = ps0;
      s1 = ps1;
      named_bar_sync(1, kThreads);  // warpgroup 1's transpose of page p is done too: the stage is free
      if (t == 0 && p + kStages < last) {  // refill it with page p + 2
        fence_async_smem();  // generic-proxy reads of the stage (transpose) before the TMA's async writes
        load_page(smem, buf, map_kv, map_rope, kv_scale, next_page_id);
        next_page_id = p + kStages + 1 < last ? bt[p + kStages + 1] : 0;
      }
    }
    wgmma_wait_all();  // PV(p - 1)
  } else {
    if constexpr (kHasCur) {  // V^T of page p while the tensor cores run PV(p - 1)
      uint8_t* vt = smem + kVT + pb * kLatent * kPage;
      if (valid == kPage) transpose_page<false>(smem, buf, vt, tw, valid);
      else transpose_page<true>(smem, buf, vt, tw, valid);
      named_bar_arrive(1, kThreads);
    }
    wgmma_wait_all();  // PV(p - 1)
  }
}

__global__ void __launch_bounds__(kThreads, 1) decode_split_sm90_kernel(
    const __grid_constant__ CUtensorMap map_kv, const __grid_constant__ CUtensorMap map_rope,
    const uint8_t* __restrict__ q8, const float* __restrict__ q_scale, const uint16_t* __restrict__ q_rope,
    const float* __restrict__ kv_scale, const int* __restrict__ block_table, const int* __restrict__ seq_lens,
    float* __restrict__ o_part, float* __restrict__ lse_part, int stride_bt, int R, int H, int S_Q,
    float qk_scale_log2, int num_splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int b = blockIdx.x, split = blockIdx.y, tile = blockIdx.z;
  const int t = threadIdx.x, wg = t / 128, tw = t % 128, warp = tw / 32, lane = tw % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBar);

  const int seq_len = seq_lens[b];
  const int n_pages = (seq_len + kPage - 1) / kPage;
  const int per_split = (n_pages + num_splits - 1) / num_splits;
  const int first = split * per_split;
  const int last = min(first + per_split, n_pages);
  const int* bt = block_table + (int64_t)b * stride_bt;

  if (t == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(full + i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // prologue: the first kStages pages in flight
  if (t == 0)
    for (int i = 0; i < kStages && first + i < last; ++i)
      load_page(smem, i, &map_kv, &map_rope, kv_scale, bt[first + i]);
  // the page id kStages ahead of the page being computed, read one iteration before it is needed (thread 0 only)
  int next_page_id = (t == 0 && first + kStages < last) ? bt[first + kStages] : 0;

  // Q tile: 64 rows of this sequence (zero rows past R)
  const int64_t q_row0 = (int64_t)b * R + tile * kRows;
  const int q_rows = R - tile * kRows;
  stage_rows<kLatent>(smem + kQ8, q8 + q_row0 * kLatent, q_rows);
  stage_rows<kRope * 2>(smem + kQR, reinterpret_cast<const uint8_t*>(q_rope) + q_row0 * kRope * 2, q_rows);
  cp_async_commit();
  cp_async_wait_all();
  fence_async_smem();  // Q was written through the generic proxy; WGMMA reads it through the async proxy
  __syncthreads();

  // accumulator rows of this thread (same mapping in both warpgroups)
  const int row0 = warp * 16 + lane / 4, row1 = row0 + 8;
  const int grow0 = tile * kRows + row0, grow1 = tile * kRows + row1;
  const float qs0 = grow0 < R ? q_scale[(int64_t)b * R + grow0] * qk_scale_log2 : 0.f;
  const float qs1 = grow1 < R ? q_scale[(int64_t)b * R + grow1] * qk_scale_log2 : 0.f;
  const int last_key0 = seq_len - S_Q + grow0 / H, last_key1 = seq_len - S_Q + grow1 / H;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f, s0 = 1.f, s1 = 1.f;  // warpgroup 0's row state

  // Iteration p: QK(p) + softmax(p) by warpgroup 0 and the transpose of page p by warpgroup 1 overlap PV(p - 1)
  // (both warpgroups, issued right after QK(p): FlashAttention-3 order), so the tensor cores run PV while the
  // softmax runs. A final step only drains PV(last - 1). Pages stay in strictly increasing order: O is rescaled for
  // page p - 1 before PV(p - 1) is issued, and PV(p) comes one step later.
  if (first < last) {
#define SNAPMLA_STEP_ARGS                                                                                        \
  first, last, seq_len, smem, full, &map_kv, &map_rope, kv_scale, bt, next_page_id, o, m0, m1, l0, l1, s0, s1, qs0, \
      qs1, last_key0, last_key1, grow0, grow1, R, row0, row1, t, wg, tw, lane
    page_step<true, false>(first, SNAPMLA_STEP_ARGS);
    for (int p = first + 1; p < last; ++p) page_step<true, true>(p, SNAPMLA_STEP_ARGS);
    page_step<false, true>(last, SNAPMLA_STEP_ARGS);
#undef SNAPMLA_STEP_ARGS
  }

  // epilogue: warpgroup 0 publishes each row's s / l and LSE; both warpgroups write their 256 columns
  float* rows_s = reinterpret_cast<float*>(smem + kRowS);
  float* rows_l = reinterpret_cast<float*>(smem + kRowL);
  if (wg == 0 && lane % 4 == 0) {
    rows_s[row0] = l0 > 0.f ? s0 / l0 : 0.f;
    rows_s[row1] = l1 > 0.f ? s1 / l1 : 0.f;
    rows_l[row0] = l0 > 0.f ? m0 + log2f(l0) : -INFINITY;
    rows_l[row1] = l1 > 0.f ? m1 + log2f(l1) : -INFINITY;
  }
  __syncthreads();
  const float w0 = rows_s[row0], w1 = rows_s[row1];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    int col = wg * 256 + j * 8 + (lane % 4) * 2;
    if (grow0 < R) {
      float* dst = o_part + (((int64_t)b * R + grow0) * num_splits + split) * kLatent + col;
      *reinterpret_cast<float2*>(dst) = make_float2(o[4 * j] * w0, o[4 * j + 1] * w0);
    }
    if (grow1 < R) {
      float* dst = o_part + (((int64_t)b * R + grow1) * num_splits + split) * kLatent + col;
      *reinterpret_cast<float2*>(dst) = make_float2(o[4 * j + 2] * w1, o[4 * j + 3] * w1);
    }
  }
  if (wg == 0 && lane % 4 == 0) {
    if (grow0 < R) lse_part[((int64_t)b * R + grow0) * num_splits + split] = rows_l[row0];
    if (grow1 < R) lse_part[((int64_t)b * R + grow1) * num_splits + split] = rows_l[row1];
  }
#endif
}

// Host side (no torch types: the file compiles on its own, e.g. for the CPU CI's sm_90a compile check).

// cuTensorMapEncodeTiled from the driver, looked up once through the runtime (no -lcuda at link time)
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [rows x row_bytes] row-major pool array seen as 2-D tiles of 64 rows x 128 B, 128 B swizzle (the K tile layout)
static bool encode_pool_map(CUtensorMap* map, const void* base, int64_t rows, int row_bytes,
                            CUtensorMapDataType dtype, int elem_bytes) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes / elem_bytes), static_cast<cuuint64_t>(rows)};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / elem_bytes), static_cast<cuuint32_t>(kPage)};
  cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

cudaError_t launch_decode_split_sm90(const void* q8, const float* q_scale, const void* q_rope, const void* kv_fp8,
                                     const float* kv_scale, const void* kv_rope, int64_t pool_rows,
                                     const int* block_table, const int* seq_lens, float* o_part, float* lse_part,
                                     int batch, int stride_bt, int R, int H, int S_Q, float qk_scale_log2,
                                     int num_splits, cudaStream_t stream) {
  // once per process (SGLang runs one process per GPU; the attribute applies to the current device), outside the
  // per-launch path so that a CUDA-graph capture records only the kernel launch
  static cudaError_t attr = cudaFuncSetAttribute(decode_split_sm90_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  // The tensor maps are kernel parameters (host-side encoding, no device work): a captured graph replays them with
  // the pool's addresses, which stay fixed for the life of a server.
  CUtensorMap map_kv, map_rope;
  if (!encode_pool_map(&map_kv, kv_fp8, pool_rows, kLatent, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1) ||
      !encode_pool_map(&map_rope, kv_rope, pool_rows, kRope * 2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2))
    return cudaErrorInvalidValue;
  dim3 grid(batch, num_splits, (R + kRows - 1) / kRows);
  decode_split_sm90_kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      map_kv, map_rope, static_cast<const uint8_t*>(q8), q_scale, static_cast<const uint16_t*>(q_rope), kv_scale,
      block_table, seq_lens, o_part, lse_part, stride_bt, R, H, S_Q, qk_scale_log2, num_splits);
  return cudaGetLastError();
}

}  // namespace snapmla
