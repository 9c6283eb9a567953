// SnapMLA split-KV decode for Hopper (sm_90a): FP8 WGMMA for content QK and PV, BF16 WGMMA for RoPE QK.
//
// One CTA = 64 query rows (flattened (token, head) pairs of one sequence) x one split of its 64-token pages, three
// warpgroups, mbarrier hand-offs only (no block-wide barrier in the page loop):
//   loads   : pages arrive by TMA (one thread issues 4 content boxes + 1 RoPE box + a 256 B bulk copy of the scales
//             per page) into three stages of 128 B-swizzled K-major tiles, "full" mbarrier per stage; a stage is
//             refilled (by warpgroup 1's first thread) once its "empty" mbarrier says QK, the softmax's scale reads
//             (released before the softmax's arithmetic) and both transposes are done with it, i.e. up to two pages
//             ahead of the page being consumed.
//   warpgroup 0 (softmax, no O): iteration c issues S(c+1) = Q8 K8^T (16 x m64n64k32 e4m3) + Q_rope' K_rope'^T
//             (4 x m64n64k16 bf16; Q from registers, loaded once per split) -- one accumulation thanks to
//             scale-domain alignment; issued in two parts, the first 8 content steps here and the rest between
//             the softmax's two passes into a second accumulator, because a warp issuing WGMMAs is held once ~8 are
//             in flight --, then runs page c's online softmax (base 2) and publishes P8(c) ("pfull") at once:
//             t = S sigma_q sigma_k + log2 sigma_k (masks only on the pages that need them), ref = rowmax(t),
//             P8(c) = fp8(2^(t - ref + log2 448)) -- SnapMLA's amax-scaled P' = P sigma_k, evaluated in the log
//             domain -- and the row factors, into the buffer of page parity once PV(c-2) has released it ("pempty").
//   warpgroups 1 and 2 (PV, output columns 0..255 / 256..511): V^T(c) = transpose of their half of the staged fp8
//             page into a K-major [256 x 64] tile (FP8 WGMMA reads both operands K-major, so PV cannot read the page
//             as stored; ldmatrix.trans + byte permutes + stmatrix, tokens in a permuted order that P8 shares;
//             tokens past the sequence end become zeros), then wait "pfull", O_g = O_g * f(c) + P8(c) V^T_g(c)
//             (2 x m64n256k32 e4m3), release P8 ("pempty").
// O (and l) are kept in the units of the current page's reference, 2^ref / 448: a page gives
// O' = O * 2^(ref_old - ref) + P8 V, so no second accumulator is needed. PV runs over the pages in strictly increasing
// order (no inverted order: it breaks with per-block P scales).
// Q and K tiles use WGMMA's 128 B-swizzle K-major layout (8 rows x 128 B atoms, 16 B chunks XOR-ed with row % 8,
// 1024 B aligned; a 512 B content row is four such tiles side by side); V^T and P8, written by threads, use the
// no-swizzle K-major layout (8-row x 16-byte core matrices).
// Stale bytes: slots past seq_len are zeroed in V^T and masked in the softmax (their scale too), so no byte of them
// reaches the output; block-table reads stop at the sequence's pages and, for the speculative first-page reads at
// one split, at the table's allocation (bt_entries), never at the width of the caller's view (CUDA-graph capture).
// Q: FP8 content, aligned RoPE and scales from the Q-quant kernel by TMA, or (kQuantizeQ, opt-in) quantized from its
// bf16 rows by the CTA's threads (quantize_q_tile), the same bytes, with no Q-quant launch before the decode.
// Outputs are the same split partials as the Triton split kernel (o_part fp32, base-2 LSE), merged by its combine;
// with one split (large batches) the kernel writes the final bf16 output and natural-log LSE itself instead, exactly
// what the combine would make of a single partial, which saves the partials' round trip through DRAM (fp32 write +
// read, 6 of every 8 output bytes; at h128 b512 s_k 1024 that was ~270 MB per call) and the combine's launch.

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

#include "snapmla_decode_sm90.h"
#include "wgmma_ops.cuh"

#ifndef SNAPMLA_SOFTMAX_REGS
#define SNAPMLA_SOFTMAX_REGS 184
#endif

namespace snapmla {

constexpr int kLatent = 512, kRope = 64, kPage = 64, kRows = 64, kThreads = 384, kStages = 3;
constexpr int kWarpgroup = 128;  // threads
// mbarrier arrival counts: a TMA load is one arrival (plus its bytes); a stage is released by every softmax thread
// (QK and the scale reads are done) and by one thread of each PV warpgroup (its V^T half is written); P8 is published
// by every softmax thread and released by every PV thread
constexpr int kTmaArrivals = 1, kStageReleases = kWarpgroup + 2, kP8Publishers = kWarpgroup,
              kP8Consumers = 2 * kWarpgroup;
// the narrow kernel's row scales (1 / l) are published by every lane of the softmax warpgroup's warp 0
constexpr int kRowScalePublishers = 32;
constexpr float kLog2Fp8Max = 8.807354922057604f;  // log2(448): P8 = 2^(t - max t + log2 448) <= 448
// softmax page references (the log-domain softmax): a page's reference stays within kRefGap of the row's running max; kNoRef stands
// for "no key seen yet" (finite, so references subtract without NaN)
constexpr float kRefGap = 64.f, kNoRef = -1e30f;
// setmaxnreg only moves registers within what the CTA was launched with: 384 threads x 168 (the most a 384-thread
// CTA gets; allocation is per 8) = 504 per lane across the three warpgroups. An increase beyond that pool waits
// forever (asking 192 + 2 x 160 = 512 hung).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8, kLanePool = kThreads / 128 * kLaunchRegs;  // 168, 504
constexpr int kSoftmaxRegs = SNAPMLA_SOFTMAX_REGS, kPvRegs = (kLanePool - kSoftmaxRegs) / 2 / 8 * 8;  // per thread
static_assert(kPvRegs % 8 == 0 && kSoftmaxRegs % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(kSoftmaxRegs + 2 * kPvRegs <= kLanePool, "setmaxnreg: more registers than the CTA holds");
constexpr int kNarrowSoftmaxRegs = 136, kNarrowPvRegs = (kLanePool - kNarrowSoftmaxRegs) / 2 / 8 * 8;  // 136, 184

// shared memory map (bytes, from a 1024 B aligned base: swizzled tiles need 1024 B alignment)
constexpr int kTile = kPage * 128;                    // one [64 rows x 128 B] swizzled tile, 8 KB
constexpr int kStageBytes = 5 * kTile + kPage * 4;    // 4 content tiles, 1 RoPE tile, 64 fp32 scales
constexpr int kQ8 = 0;                                // 4 tiles [64 rows x 128 B]
constexpr int kQR = kQ8 + 4 * kTile;                  // 1 tile [64 rows x 64 bf16]
constexpr int kStage0 = kQR + kTile;                  // kStages x kStageBytes (padded to 1024 B)
constexpr int kStagePitch = (kStageBytes + 1023) / 1024 * 1024;
// V^T rows of 8 channels (4 core matrices of 8 channels x 16 tokens, 512 B) are 528 B apart: +16 B puts the
// channel groups k and k + 1 on different banks, so each 8-row stmatrix of the transpose is conflict-free
constexpr int kVTStride = kPage / 16 * 128 + 16;
constexpr int kVTHalfBytes = kLatent / 2 / 8 * kVTStride;  // one PV warpgroup's [256 x 64] fp8 V^T
constexpr int kVT = kStage0 + kStages * kStagePitch;  // 2 V^T halves (one per PV warpgroup)
constexpr int kP8Bytes = kRows * kPage;               // one [64 rows x 64 B] fp8 P8
constexpr int kP8 = kVT + 2 * kVTHalfBytes;           // 2 P8 buffers (page parity)
constexpr int kRowF = kP8 + 2 * kP8Bytes;             // 2 x [64] fp32 per-row O rescale factor
constexpr int kRowS = kRowF + 2 * kRows * 4;          // [64] fp32 final scale 1 / l
constexpr int kRowL = kRowS + kRows * 4;              // [64] fp32 final base-2 LSE
constexpr int kBar = kRowL + kRows * 4;               // mbarriers: full / empty per stage, pfull / pempty per P8, qfull
// [64] fp32 Q scales, where the kernel quantizes Q itself (after the barriers: the TMA path's offsets stay as they are)
constexpr int kRowQ = kBar + (2 * kStages + 5) * 8;
constexpr int kSmemBytes = kRowQ + kRows * 4 + 1024;  // + 1024: slack to align the base
static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-CTA limit");

// byte offset of (row, byte) in a run of 128 B-swizzled [64 rows x 128 B] tiles that hold rows wider than 128 B
// side by side (byte 128 t ..+127 of every row in tile t)
__device__ __forceinline__ int sw128(int row, int byte) {
  return (byte >> 7) * kTile + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// start-address field shared by both descriptor kinds (bits 0-13: shared address >> 4)
__device__ __forceinline__ uint64_t desc_start(const uint8_t* p) { return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4); }

__device__ __forceinline__ uint64_t smem_desc(const uint8_t* p, int stride_byte_offset) {
  uint64_t d = desc_start(p);
  d |= (uint64_t)(128 >> 4) << 16;                        // leading byte offset: next core matrix along K
  d |= (uint64_t)((stride_byte_offset & 0x3FFFF) >> 4) << 32;  // stride byte offset: next 8 rows
  return d;                                               // base offset 0, swizzle mode 0 (none)
}

// K-major, 128 B swizzle: rows of 128 B, 8-row atoms 1024 B apart; stepping along K inside the 128 B row is a byte
// offset added to the start address (the hardware applies the XOR on the final address bits)
__device__ __forceinline__ uint64_t smem_desc_sw128(const uint8_t* p) {
  uint64_t d = desc_start(p);
  d |= (uint64_t)1 << 16;                 // leading byte offset: unused for swizzled K-major
  d |= (uint64_t)(1024 >> 4) << 32;       // stride byte offset: next 8-row atom
  d |= (uint64_t)1 << 62;                 // layout: 128 B swizzle
  return d;
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
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// named barrier kId over kCount threads (whole warps); immediate operands, so ptxas knows which barriers are used
template <int kId, int kCount>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_u32(bar)) : "memory");
}
// [64 rows x 128 B] box of a 3-D map {row elements, R, B} (the Q tiles; rows past R, the next sequence's, are
// zero-filled by the hardware and still count in the transaction bytes)
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar)) : "memory");
}
// bf16 output box [64 rows x 64 columns] from a 128 B-swizzled shared tile to out[b, row, col] (3-D map {512, R, B}:
// rows past R, i.e. past the sequence's query rows, are clipped by the hardware)
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int col, int row, int b) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
               ::"l"(map), "r"(col), "r"(row), "r"(b), "r"(smem_u32(src)) : "memory");
}
// commit this thread's bulk stores and wait until they have read shared memory (not until global memory is written:
// the CTA may exit then, and the next CTA on the SM may reuse the buffer)
__device__ __forceinline__ void bulk_store_commit_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// wait until at most `kPending` committed WGMMA groups of this warpgroup are still running
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// One thread: page `page` of the pool into `stage` (4 content boxes, the RoPE box, the scales), all completing on
// the stage's mbarrier `bar`.
__device__ __forceinline__ void load_page(uint8_t* stage, uint64_t* bar, const CUtensorMap* map_kv,
                                          const CUtensorMap* map_rope, const float* kv_scale, int64_t page) {
  mbar_expect_tx(bar, kStageBytes);
  const int row = static_cast<int>(page * kPage);
#pragma unroll
  for (int blk = 0; blk < 4; ++blk) tma_load_2d(stage + blk * kTile, map_kv, blk * 128, row, bar);
  tma_load_2d(stage + 4 * kTile, map_rope, 0, row, bar);
  bulk_load(stage + 5 * kTile, kv_scale + page * kPage, kPage * 4, bar);
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d) : "memory");
}

// The V transpose of a PV warpgroup (`tw` = 0..127) works in units of 16 tokens x 32 channels: one
// ldmatrix.x4.trans reads a unit as four 8 x 8 b16 matrices (tokens +0/+8 x channels +0/+16), which leaves each thread
// 2 x 2 byte blocks (tokens 2q, 2q+1 of channels 2j, 2j+1; q = lane % 4, j = lane / 4); two byte permutes per
// register pair regroup them per channel. transpose_unit does that for token group g of warp w's 32-channel chunk in
// the half's 128-channel tile ci: x0 / y0 hold channels 2j, 2j+1 and x1 / y1 channels 2j+16, 2j+17, each at the four
// token slots 4q..4q+3 (tokens 16 g + (2q, 2q+1, 8+2q, 9+2q)). Tokens at or past `valid` become zeros (kMasked: last
// page only).
// (lane = tw % 32: warp = tw / 32, m = lane / 8, r = lane % 8)
__device__ __forceinline__ uint32_t transpose_read_base(const uint8_t* stage, int half, int warp, int m, int r) {
  // ldmatrix row addresses: matrix m = tokens + 8 (m & 1), 16 B chunk + (m >> 1) of the swizzled 128 B row
  return smem_u32(stage + 2 * half * kTile) + (8 * (m & 1) + r) * 128 + (((2 * warp + (m >> 1)) ^ r) << 4);
}
template <bool kMasked>
__device__ __forceinline__ void transpose_unit(uint32_t rd, int ci, int g, int q, int valid, uint32_t& x0,
                                               uint32_t& y0, uint32_t& x1, uint32_t& y1) {
  uint32_t v[4];
  ldsm_x4_trans(rd + ci * kTile + g * 16 * 128, v);
  x0 = __byte_perm(v[0], v[1], 0x6420), y0 = __byte_perm(v[0], v[1], 0x7531);
  x1 = __byte_perm(v[2], v[3], 0x6420), y1 = __byte_perm(v[2], v[3], 0x7531);
  if (kMasked) {
    const int t0 = 16 * g + 2 * q;
    const uint32_t keep = (t0 < valid ? 0xFFu : 0u) | (t0 + 1 < valid ? 0xFF00u : 0u) |
                          (t0 + 8 < valid ? 0xFF0000u : 0u) | (t0 + 9 < valid ? 0xFF000000u : 0u);
    x0 &= keep, y0 &= keep, x1 &= keep, y1 &= keep;
  }
}

// V^T (K-major over tokens) from the staged page into shared memory, by the 128 threads of a PV warpgroup (`tw` =
// 0..127), for the 64-row kernel: one transpose_unit per 16 tokens x 32 channels, then one stmatrix.x4 writes its
// four 8-channel x 16 B rows. Within every 16-token group the tokens land in the slot order (2q, 2q+1, 8+2q, 9+2q)
// at slots 4q..4q+3 -- the order of the QK accumulator's columns in a thread, so P8 is written in the same order
// with 32-bit stores (PV sums over tokens: any order shared by P8 and V^T gives the same product). Warp w takes the
// 32-channel chunks w + 4 ci (ci = 0..3, one swizzled tile each) x the 4 token groups: every address is a per-thread
// base plus a compile-time offset; reads and writes are bank-conflict-free (tools/kernel_dev/emulate_transpose.py
// checks the mapping and the banks on the layouts).
// A variant with 4-byte loads/stores and 6 permutes per 4 x 4 block: 2.3x the instructions, and the profile
// showed it as the longest path of the page loop.
template <bool kMasked>
__device__ __forceinline__ void transpose_half(const uint8_t* stage, uint8_t* vt, int half, int tw, int valid) {
  const int lane = tw % 32, warp = tw / 32, m = lane / 8, r = lane % 8, q = lane % 4;
  const uint32_t rd = transpose_read_base(stage, half, warp, m, r);
  // stmatrix row addresses: matrix m = channels 2 r + (m & 1) + 16 (m >> 1) of the 32-channel chunk
  const uint32_t wr = smem_u32(vt) + (4 * warp + 2 * (m >> 1) + r / 4) * kVTStride +
                      (2 * (r % 4) + (m & 1)) * 16;
#pragma unroll
  for (int ci = 0; ci < 2; ++ci) {  // the half's two 128-channel tiles
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t x0, y0, x1, y1;
      transpose_unit<kMasked>(rd, ci, g, q, valid, x0, y0, x1, y1);
      stsm_x4(wr + ci * 16 * kVTStride + g * 128, x0, y0, x1, y1);
    }
  }
}

// The narrow kernel's V^T straight into WGMMA A fragments (PV as register-A MMAs: no V^T tile in shared memory).
// Warp w's registers of unit (ci, g) hold channels c = 128 ci + 32 w + 2 j + {0, 1, 16, 17} (j = lane / 4) of the
// half, tokens at slots 4q..4q+3 of group g, which is an m64nNk32 A fragment's layout (a0 / a2: row j, K 4q..4q+3 /
// 16+4q..; a1 / a3: row j + 8) once M rows are assigned to channels that way: M tile mt = 2 ci + s, row 16 w + j + 8 h
// <->  channel 128 ci + 32 w + 16 s + 2 j + h (`narrow_pv_channel`); K step ks = g / 2. The K slots are
// transpose_half's, so P8 needs no change.
template <bool kMasked>
__device__ __forceinline__ void transpose_half_fragments(const uint8_t* stage, int half, int tw, int valid,
                                                         uint32_t (&a)[4][2][4]) {
  const int lane = tw % 32, warp = tw / 32, m = lane / 8, r = lane % 8, q = lane % 4;
  const uint32_t rd = transpose_read_base(stage, half, warp, m, r);
#pragma unroll
  for (int ci = 0; ci < 2; ++ci) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t x0, y0, x1, y1;
      transpose_unit<kMasked>(rd, ci, g, q, valid, x0, y0, x1, y1);
      const int ks = g / 2, lo = 2 * (g % 2);
      a[2 * ci][ks][lo] = x0, a[2 * ci][ks][lo + 1] = y0;
      a[2 * ci + 1][ks][lo] = x1, a[2 * ci + 1][ks][lo + 1] = y1;
    }
  }
}
// The latent channel (0..511) of PV warpgroup `half`'s accumulator row 16 warp + lane / 4 + 8 h of M tile mt, for the
// fragments above
__device__ __forceinline__ int narrow_pv_channel(int half, int mt, int warp, int lane, int h) {
  return half * 256 + (mt >> 1) * 128 + 32 * warp + 16 * (mt & 1) + 2 * (lane / 4) + h;
}

// 2^x by the SFU (ex2.approx.ftz: ~2 ulp, -inf -> 0, subnormal results flushed to 0, as softmax weights can be)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) by the SFU (lg2.approx.ftz: ~2^-22 absolute; 0 -> -inf; x is a K scale, >= 2^-20 or 0 past the end)
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1/x by the SFU (rcp.approx.ftz: ~1 ulp; x is a K scale, >= 2^-20)
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A softmax row's page reference (both kernels): the page's max t, but at most kRefGap below the row's running max
// (this page included): a page far weaker than an earlier one would otherwise scale O and l up by
// 2^(ref_old - ref_new) towards fp32 overflow; its P8 then uses less than the FP8 range and carries < 2^-64 of the
// weight. kNoRef while the row has seen no key.
__device__ __forceinline__ float page_reference(float page_max, float running_max) {
  return fmaxf(fmaxf(page_max, running_max - kRefGap), kNoRef);
}

// Two fp8 values (RNE, saturating to +-448, the reference's to_fp8) packed for one 16-bit store: `lo` at the lower
// address.
__device__ __forceinline__ uint16_t to_fp8x2(float lo, float hi) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}

// Q's quantization inside the 64-row kernel (`q_nope` passed; sglang_snapmla.numerics.quantize_q bit for bit, as the
// Triton Q-quant computes it): scale = max(amax / 448, 2^-20) by IEEE division, content = fp8(x / scale) (RNE,
// saturating), RoPE' = bf16(rope / scale); a row holding a NaN or an infinity is stored as content 0, RoPE 0 and
// scale NaN. Reading the bf16 rows here instead of the Q-quant's output saves the quantized Q's round trip through
// DRAM (written by one kernel, read by the next) and the Q-quant's launch: at h128 b128 that is 21 MB of 40.
constexpr float kFp8Max = 448.f, kScaleFloor = 0x1p-20f;
constexpr uint32_t kBf16Inf = 0x7F80u;  // |bf16| bit patterns above this are NaNs
// x / s for a value x of the row and r = RN(1 / s): x r and one Markstein correction, the division's correctly
// rounded quotient for every bf16 x with |x| <= 448 s under every scale a bf16 row can have (the Triton kernels'
// _div_rn; `python -m tools.kernel_dev.q_division_sweep` checks them all); x's sign bit keeps x = -0 at -0.
__device__ __forceinline__ float div_by_scale(float x, float s, float r) {
  const float q = __fmul_rn(x, r);
  const float e = __fmaf_rn(-s, q, x);  // x - s q, exact
  return __uint_as_float(__float_as_uint(__fmaf_rn(e, r, q)) | (__float_as_uint(x) & 0x80000000u));
}
// Rows [tile x 64, +64) of sequence b quantized into the Q8 and Q RoPE tiles (the layout the TMA path loads) and
// `rows_q` [64], by all 384 threads (`t`) while the first pages are in flight: warp w takes rows w, w + 12, ..., lane
// l a row's content values 16 l .. 16 l + 15 and RoPE values 2 l, 2 l + 1. Row r of the sequence is (token
// b x S_Q + r / H, head r % H) of q_nope [T, H, 512] / q_pe [T, H, 64] (strides in elements; rows 16-byte aligned,
// RoPE pairs 4-byte aligned: `ops` checks). Rows past R become zeros. All loads go out before the first row is
// reduced: one DRAM round trip per CTA.
__device__ __forceinline__ void quantize_q_tile(uint8_t* smem, float* rows_q, const __nv_bfloat16* q_nope,
                                                const __nv_bfloat16* q_pe, int64_t sn_t, int64_t sn_h, int64_t sp_t,
                                                int64_t sp_h, int b, int tile, int R, int H, int S_Q, int t) {
  constexpr int kWarps = kThreads / 32, kPerWarp = (kRows + kWarps - 1) / kWarps;  // 12 warps, 5 or 6 rows each
  const int w = t / 32, lane = t % 32;
  uint4 c[kPerWarp][2];
  uint32_t rp[kPerWarp];
  // (token, head) of the warp's first row, then stepped by kWarps rows (one integer division per thread)
  int grow = tile * kRows + w, tok = b * S_Q + grow / H, head = grow % H;
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i, grow += kWarps) {
    c[i][0] = c[i][1] = make_uint4(0, 0, 0, 0), rp[i] = 0;
    if (w + kWarps * i < kRows && grow < R) {
      const uint4* src = reinterpret_cast<const uint4*>(q_nope + tok * sn_t + head * sn_h) + 2 * lane;
      c[i][0] = __ldg(src), c[i][1] = __ldg(src + 1);
      rp[i] = __ldg(reinterpret_cast<const unsigned int*>(q_pe + tok * sp_t + head * sp_h) + lane);
    }
    for (head += kWarps; head >= H; head -= H) ++tok;
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int row = w + kWarps * i;
    if (row >= kRows) break;
    const uint32_t words[8] = {c[i][0].x, c[i][0].y, c[i][0].z, c[i][0].w, c[i][1].x, c[i][1].y, c[i][1].z, c[i][1].w};
    // the row's largest |content| and |RoPE| as bf16 bit patterns with the sign cleared (finite magnitudes order as
    // their values, +inf above them, every NaN above +inf): content in the high half, RoPE in the low half of one
    // word, so one per-halfword max (vmaxu2) per shuffle reduces both
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) m = __vmaxu2(m, words[k] & 0x7FFF7FFFu);
    uint32_t both = (max(m & 0xFFFFu, m >> 16) << 16) | max(rp[i] & 0x7FFFu, (rp[i] >> 16) & 0x7FFFu);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) both = __vmaxu2(both, __shfl_xor_sync(0xffffffff, both, x));
    uint4* content = reinterpret_cast<uint4*>(smem + kQ8 + sw128(row, 16 * lane));
    __nv_bfloat162* rope = reinterpret_cast<__nv_bfloat162*>(smem + kQR + sw128(row, 4 * lane));
    if ((both >> 16) >= kBf16Inf || (both & 0xFFFFu) >= kBf16Inf) {  // warp-uniform: the spec's non-finite row
      *content = make_uint4(0, 0, 0, 0);
      *rope = __floats2bfloat162_rn(0.f, 0.f);
      if (lane == 0) rows_q[row] = __uint_as_float(0x7FC00000u);  // NaN
      continue;
    }
    const float s = fmaxf(__fdiv_rn(__uint_as_float(both & 0xFFFF0000u), kFp8Max), kScaleFloor);
    const float r = __fdiv_rn(1.f, s);
    uint32_t q8[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = words[2 * k], hi = words[2 * k + 1];
      q8[k] = to_fp8x2(div_by_scale(__uint_as_float(lo << 16), s, r),
                       div_by_scale(__uint_as_float(lo & 0xFFFF0000u), s, r)) |
              static_cast<uint32_t>(to_fp8x2(div_by_scale(__uint_as_float(hi << 16), s, r),
                                             div_by_scale(__uint_as_float(hi & 0xFFFF0000u), s, r))) << 16;
    }
    *content = make_uint4(q8[0], q8[1], q8[2], q8[3]);
    *rope = __floats2bfloat162_rn(__fdiv_rn(__uint_as_float(rp[i] << 16), s),
                                  __fdiv_rn(__uint_as_float(rp[i] & 0xFFFF0000u), s));
    if (lane == 0) rows_q[row] = s;
  }
}

// The pages [first, last) of split `split` of a sequence of `len` tokens
__device__ __forceinline__ void split_pages(int len, int split, int num_splits, int& first, int& last) {
  const int pages = (len + kPage - 1) / kPage, per_split = (pages + num_splits - 1) / num_splits;
  first = split * per_split;
  last = min(first + per_split, pages);
}

// Thread 0 of a CTA: the split's first kStages pages into the stages. With one split they are block-table entries
// 0..2 whatever the length, so those loads go out together with the length's (one round trip fewer before the TMA);
// entries past the sequence's pages are read but never used. `bt_readable` bounds that read by the block table's
// allocation (entries from this row's start to the end of its storage), never by the width of the view the caller
// passed: SGLang captures decode graphs with a width-1 view of a full-stride table and replays them with longer
// sequences, and a width frozen into the graph would replace pages 1 and 2 by page 0.
// Not inlined: inlined, its registers raised the kernel's spills (200 / 512 B instead of 124 / 304 at one split)
// and put spill loads into the PV page loop.
// `stage0`: the first of the kernel's kNumStages stages (kStagePitch apart), `full`: their mbarriers.
template <int kNumStages>
__device__ __noinline__ void load_first_pages(uint8_t* stage0, uint64_t* full, const CUtensorMap* map_kv,
                                              const CUtensorMap* map_rope, const float* kv_scale, const int* bt,
                                              const int& seq_len, int split, int num_splits, int64_t bt_readable) {
  int head[kNumStages];
#pragma unroll
  for (int i = 0; i < kNumStages; ++i) head[i] = num_splits == 1 && i < bt_readable ? bt[i] : 0;
  int first, last;
  split_pages(seq_len, split, num_splits, first, last);
  for (int i = 0; i < kNumStages && first + i < last; ++i)
    load_page(stage0 + i * kStagePitch, full + i, map_kv, map_rope, kv_scale,
              num_splits == 1 ? head[i] : bt[first + i]);
}

// kFinal: one split, the final outputs (out, lse_out) instead of the partials (a template parameter, not a runtime
// flag: the flag and the two extra pointers kept live through the page loop doubled the spills)
// q_nope / q_pe and their strides (elements) where the kernel quantizes Q itself (kQuantizeQ), else empty
struct QBf16 {
  const __nv_bfloat16* nope;
  const __nv_bfloat16* pe;
  int64_t nope_t, nope_h, pe_t, pe_h;
};

// kQuantizeQ: Q from bf16 rows (qb), quantized by the kernel's threads, instead of Q8 / RoPE' / scales by TMA (an
// instantiation of its own: without it the kernel's code is the TMA path's alone)
template <bool kFinal, bool kQuantizeQ>
__global__ void __launch_bounds__(kThreads, 1) decode_split_sm90_kernel(
    const __grid_constant__ CUtensorMap map_kv, const __grid_constant__ CUtensorMap map_rope,
    const __grid_constant__ CUtensorMap map_q8, const __grid_constant__ CUtensorMap map_qr,
    const __grid_constant__ CUtensorMap map_out, const float* __restrict__ q_scale,
    const float* __restrict__ kv_scale, const int* __restrict__ block_table, const int* __restrict__ seq_lens,
    float* __restrict__ o_part, float* __restrict__ lse_part, float* __restrict__ lse_out, int stride_bt,
    int64_t bt_entries, int R, int H, int S_Q, float qk_scale_log2, int num_splits, int part_slots,
    int kv_before_wait, const QBf16 qb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint8_t smem_raw[];
  // 1024 B alignment (128 B swizzle atoms) by an offset from smem_raw: the pointer keeps its shared-memory provenance
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int tile = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
  const int t = threadIdx.x, wg = t / 128, tw = t % 128, warp = tw / 32, lane = tw % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBar);  // [kStages] TMA landed
  uint64_t* empty = full + kStages;                            // [kStages] QK (wg 0) and both V^T halves done
  uint64_t* pfull = empty + kStages;                           // [2] P8 / row factors published (wg 0)
  uint64_t* pempty = pfull + 2;                                // [2] PV done with P8 (wg 1 and 2)
  uint64_t* qfull = pempty + 2;                                // Q landed (TMA) or quantized here
  // Q from bf16 rows: every thread quantizes part of it into the same tiles and arrives on qfull
  constexpr bool quantize_q = kQuantizeQ;
  constexpr int kQuantizers = kThreads;

  if (t == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(full + i, kTmaArrivals), mbar_init(empty + i, kStageReleases);
    for (int i = 0; i < 2; ++i) mbar_init(pfull + i, kP8Publishers), mbar_init(pempty + i, kP8Consumers);
    mbar_init(qfull, quantize_q ? kQuantizers : kTmaArrivals);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the barriers are initialised before any thread uses them
  const int* bt = block_table + (int64_t)b * stride_bt;
  const int64_t bt_readable = bt_entries - (int64_t)b * stride_bt;  // entries of the table's storage from bt on
  // Programmatic dependent launch (a no-op without it): the launch and the prologue overlap the previous kernel.
  // Q, q_scale and the outputs are touched only after griddepcontrol.wait. The lengths, the block table and the
  // pool may be read before it when the caller says the previous kernel is the Q quantization (kv_before_wait):
  // that kernel lets this one start only after its own wait, i.e. once every earlier kernel (the K append, the
  // metadata copies) has completed, and it writes none of them; so the first pages' round trips overlap it
  // (docs/KERNEL.md). No early trigger for the combine: its CTAs would sit on the SMs this grid leaves
  // free and waiting there cost 1.5 us at h128 b8 s_k 640 (docs/BENCHMARKS.md).
  if (kv_before_wait && t == 0)
    load_first_pages<kStages>(smem + kStage0, full, &map_kv, &map_rope, kv_scale, bt, seq_lens[b], split, num_splits,
                              bt_readable);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (t == 32 && !quantize_q) {  // Q of the tile by TMA (a warp other than the page loader's, still in its round trips)
    mbar_expect_tx(qfull, 5 * kTile);
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) tma_load_3d(smem + kQ8 + blk * kTile, &map_q8, blk * 128, tile * kRows, b, qfull);
    tma_load_3d(smem + kQR, &map_qr, 0, tile * kRows, b, qfull);
  }
  if (!kv_before_wait && t == 0)
    load_first_pages<kStages>(smem + kStage0, full, &map_kv, &map_rope, kv_scale, bt, seq_lens[b], split, num_splits,
                              bt_readable);
  const int seq_len = seq_lens[b];
  int first, last;
  split_pages(seq_len, split, num_splits, first, last);
  if (!kFinal && first >= last) {
    // A split without pages (serving sizes the split count for the longest sequence a CUDA graph holds: a 640-token
    // sequence at a 32k bound runs 57 splits, 47 of them empty). Its LSE -inf makes the combine skip its partial
    // rows, so they are not written (64 rows x 2 KB per CTA). The Q load is already in flight into this CTA's
    // shared memory: its issuer waits for it before the CTA may exit.
    if (t < kRows && tile * kRows + t < R)
      lse_part[((int64_t)b * R + tile * kRows + t) * part_slots + split] = -INFINITY;
    if (t == 32 && !quantize_q) mbar_wait(qfull, 0);
    return;
  }

  // accumulator rows of this thread (the same mapping in every warpgroup)
  const int row0 = warp * 16 + lane / 4, row1 = row0 + 8;
  const int grow0 = tile * kRows + row0, grow1 = tile * kRows + row1;
  const int n_mine = last - first;
  // a split's pages cycle through the stages in order: page -> stage, and the parity of that stage's k-th use
  auto stage_index = [&](int page) { return (page - first) % kStages; };
  auto stage_of = [&](int page) { return smem + kStage0 + stage_index(page) * kStagePitch; };
  auto use_parity = [&](int page) { return ((page - first) / kStages) & 1; };
  auto valid_of = [&](int page) { return min(kPage, seq_len - page * kPage); };
  float* rows_s = reinterpret_cast<float*>(smem + kRowS);
  float* rows_l = reinterpret_cast<float*>(smem + kRowL);
  float* rows_q = reinterpret_cast<float*>(smem + kRowQ);
  if (quantize_q) {
    quantize_q_tile(smem, rows_q, qb.nope, qb.pe, qb.nope_t, qb.nope_h, qb.pe_t, qb.pe_h, b, tile, R, H, S_Q, t);
    mbar_arrive(qfull);  // release: the tiles and rows_q are visible to the softmax warpgroup once it has waited
  }

  if (wg == 0) {
    // ---- softmax warpgroup: QK of page c+1 runs on the tensor cores while the softmax of page c runs here ----
    // registers: 184 here (80 of them hold Q), 160 in each PV warpgroup (128 accumulators): 184 + 2 x 160 = 3 x 168,
    // the launch's allocation
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kSoftmaxRegs));
    float qs0 = grow0 < R && !quantize_q ? q_scale[(int64_t)b * R + grow0] * qk_scale_log2 : 0.f;
    float qs1 = grow1 < R && !quantize_q ? q_scale[(int64_t)b * R + grow1] * qk_scale_log2 : 0.f;
    const int last_key0 = seq_len - S_Q + grow0 / H, last_key1 = seq_len - S_Q + grow1 / H;
    // pages below this one hold only keys that every row of the tile sees (no causal or sequence-end mask)
    const int unmasked_end = (seq_len - S_Q + 1) / kPage;
    // per row: the current page reference, the running max of the page maxima, the denominator (this thread's
    // columns, in units of 2^ref / 448)
    float ref0 = kNoRef, ref1 = kNoRef, run0 = -INFINITY, run1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    // Q as the register operand of QK: WGMMA's A fragment of a 16-row x 32-byte block per warp is what
    // ldmatrix.x4 returns for it (the same byte layout for e4m3 k32 and bf16 k16), loaded once for the whole split:
    // 16 content + 4 RoPE K steps x 4 registers. Every QK then reads only K from shared memory (40 KB per page
    // instead of 80: docs/KERNEL.md).
    uint32_t q_frag[kLatent / 32][4], qr_frag[kRope * 2 / 32][4];
    mbar_wait(qfull, 0);
    if (quantize_q) {
      qs0 = grow0 < R ? rows_q[row0] * qk_scale_log2 : 0.f;
      qs1 = grow1 < R ? rows_q[row1] * qk_scale_log2 : 0.f;
    }
    {
      const int frow = 16 * warp + (lane % 8) + 8 * ((lane / 8) % 2), fbyte = 16 * (lane / 16);
#pragma unroll
      for (int k = 0; k < kLatent / 32; ++k) ldsm_x4(smem_u32(smem + kQ8) + sw128(frow, 32 * k + fbyte), q_frag[k]);
#pragma unroll
      for (int k = 0; k < kRope * 2 / 32; ++k)
        ldsm_x4(smem_u32(smem + kQR) + sw128(frow, 32 * k + fbyte), qr_frag[k]);
    }
    // K descriptor: K steps as constant start-address increments (address >> 4 stays inside the 14-bit field, so a
    // plain add is exact); keeps the QK issue at ~2 instructions per WGMMA
    // QK is issued in two parts. A warp that issues WGMMAs is held once ~8 are in flight: after that, issue
    // proceeds at the tensor pipe's rate (tools/kernel_dev/wgmma_issue_probe.cu: 20 QK WGMMAs take 460-720 cycles to
    // issue). Part 1 (the first kQkFirst content steps) fits the queue and is issued before the softmax; part 2
    // (the rest, and the RoPE steps) between the softmax's two passes. By then PV(c - 1) is in the queue, so part 2
    // is still held in part: -0.5 to -3.8 % against issuing it in one part, not the ~15 % the probe allows (docs/KERNEL.md).
    constexpr int kQkFirst = 8;
    auto issue_qk_part = [&](float (&s)[32], int page, auto part) {
      constexpr int kPart = decltype(part)::value;
      const uint64_t desc_k = smem_desc_sw128(stage_of(page));
      if (kPart == 0) wgmma_fence();
#pragma unroll
      for (int k = kPart == 0 ? 0 : kQkFirst; k < (kPart == 0 ? kQkFirst : kLatent / 32); ++k)
        wgmma_m64n64k32_e4m3_rs(s, q_frag[k], desc_k + (((k / 4) * kTile + (k % 4) * 32) >> 4),
                                k != 0 && k != kQkFirst);
      if (kPart == 1) {
#pragma unroll
        for (int k = 0; k < kRope * 2 / 32; ++k)
          wgmma_m64n64k16_bf16_rs(s, qr_frag[k], desc_k + ((4 * kTile + k * 32) >> 4), 1);
      }
      wgmma_commit();  // each part its own group: part 2 is issued from inside the softmax
    };
    // part 2 accumulates into its own registers (summed in fp32 after the wait): chaining it onto part 1's
    // accumulator across the softmax code makes ptxas serialize every WGMMA (C7514)
    auto issue_qk = [&](float (&s)[32], float (&s2)[32], int page) {
      issue_qk_part(s, page, std::integral_constant<int, 0>{});
      issue_qk_part(s2, page, std::integral_constant<int, 1>{});
    };
    // this thread's P8 words: rows row0 / row1, slots 16 i + 4 (lane % 4) of the K-major [64 x 64] tile
    const uint32_t p8_row0 = smem_u32(smem + kP8) + (row0 >> 3) * 512 + (row0 & 7) * 16 + (lane % 4) * 4;
    const uint32_t p8_row1 = p8_row0 + 512;  // row1 = row0 + 8: the next 8-row group
    // Online softmax of one page in the log domain of P'. With u_j = S_j sigma_kj and qs = sigma_q x softmax
    // scale x log2 e, key j weighs P'_j = 2^(t_j - m) in O, t_j = u_j qs + log2 sigma_kj (V's scale inside the
    // exponent). SnapMLA's block scale sigma_P = max_j P'_j / 448 is then 2^(max_j t_j - m) / 448 and
    // P8_j = P'_j / sigma_P = 2^(t_j - max_j t_j + log2 448): the same amax quantization without forming P', its
    // row max or the division (one row reduction per page instead of two, ~3 ALU ops per score fewer: 540 -> 441
    // instructions per page and warp, ~1.5 % of the time at h128; docs/KERNEL.md). O and l are kept in
    // units of 2^ref / 448, ref = the row's page reference, so the rescale between pages is 2^(ref_old - ref_new)
    // and the denominator adds P_j = P8_j (unrounded) / sigma_kj = 448 x 2^(x_j - ref). Exact while a page's
    // sigma_k spread stays below ~2^100 (P_j of a key 2^100 weaker in sigma_k than the page's strongest underflows;
    // sigma_k lies in [2^-20, amax / 448]).
    auto softmax_to_p8 = [&](float (&s)[32], int page, int pb, auto masked, auto&& between_passes) {
      constexpr bool kMasked = decltype(masked)::value;
      const float* ks = reinterpret_cast<const float*>(stage_of(page) + 5 * kTile);
      const int valid = valid_of(page);
      float kscale[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = j * 8 + (lane % 4) * 2;
        const float2 k2 = *reinterpret_cast<const float2*>(ks + col);
        kscale[2 * j] = !kMasked || col < valid ? k2.x : 0.f;
        kscale[2 * j + 1] = !kMasked || col + 1 < valid ? k2.y : 0.f;
      }
      // QK(page) has completed and the token scales were this warpgroup's last reads of the stage: released now, so
      // that its refill is not held until this page's softmax ends
      mbar_arrive(empty + stage_index(page));
      // row reductions over 4 partials each: dependency chains of 4 instead of 16 (one warp per scheduler runs
      // this, so latency, not issue, bounds it)
      float mx0[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, mx1[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float ksc = kscale[2 * j + c], lg = fast_log2(ksc);  // -inf past the sequence end (ksc = 0)
          float t0 = fmaf(s[4 * j + c] * ksc, qs0, lg), t1 = fmaf(s[4 * j + 2 + c] * ksc, qs1, lg);
          if (kMasked) {  // also replaces whatever the page's unwritten tail made of S (NaN x 0) by -inf
            const int key = page * kPage + j * 8 + (lane % 4) * 2 + c;
            t0 = (key <= last_key0 && grow0 < R) ? t0 : -INFINITY;
            t1 = (key <= last_key1 && grow1 < R) ? t1 : -INFINITY;
          }
          s[4 * j + c] = t0;
          s[4 * j + 2 + c] = t1;
          mx0[(2 * j + c) % 4] = fmaxf(mx0[(2 * j + c) % 4], t0);
          mx1[(2 * j + c) % 4] = fmaxf(mx1[(2 * j + c) % 4], t1);
        }
      }
      between_passes();
      float pm0 = fmaxf(fmaxf(mx0[0], mx0[1]), fmaxf(mx0[2], mx0[3]));
      float pm1 = fmaxf(fmaxf(mx1[0], mx1[1]), fmaxf(mx1[2], mx1[3]));
#pragma unroll
      for (int x = 1; x < 4; x <<= 1) {
        pm0 = fmaxf(pm0, __shfl_xor_sync(0xffffffff, pm0, x));
        pm1 = fmaxf(pm1, __shfl_xor_sync(0xffffffff, pm1, x));
      }
      run0 = fmaxf(run0, pm0);
      run1 = fmaxf(run1, pm1);
      const float nr0 = page_reference(pm0, run0), nr1 = page_reference(pm1, run1);
      const float f0 = fast_exp2(ref0 - nr0), f1 = fast_exp2(ref1 - nr1);  // O and l: old units -> new units
      const float b0 = nr0 - kLog2Fp8Max, b1 = nr1 - kLog2Fp8Max;
      float sp0[4] = {}, sp1[4] = {};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = (2 * j + c) % 4;
          const float ksc = kscale[2 * j + c];
          const float inv_k = kMasked && !(ksc > 0.f) ? 0.f : fast_rcp(ksc);
          const float p0 = fast_exp2(s[4 * j + c] - b0), p1 = fast_exp2(s[4 * j + 2 + c] - b1);
          sp0[r] = fmaf(p0, inv_k, sp0[r]);  // P = P8 / sigma_k, for the denominator
          sp1[r] = fmaf(p1, inv_k, sp1[r]);
          s[4 * j + c] = p0;
          s[4 * j + 2 + c] = p1;
        }
      }
      // l stays this thread's partial over its 16 columns: the four threads of a row share f, so their sum is taken
      // once, after the last page
      l0 = fmaf(l0, f0, (sp0[0] + sp0[1]) + (sp0[2] + sp0[3]));
      l1 = fmaf(l1, f1, (sp1[0] + sp1[1]) + (sp1[2] + sp1[3]));
      ref0 = nr0;
      ref1 = nr1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 2 * i;
        const uint32_t lo0 = to_fp8x2(s[4 * j], s[4 * j + 1]), hi0 = to_fp8x2(s[4 * j + 4], s[4 * j + 5]);
        const uint32_t lo1 = to_fp8x2(s[4 * j + 2], s[4 * j + 3]), hi1 = to_fp8x2(s[4 * j + 6], s[4 * j + 7]);
        st_shared_u32(p8_row0 + pb * kP8Bytes + i * 128, lo0 | hi0 << 16);
        st_shared_u32(p8_row1 + pb * kP8Bytes + i * 128, lo1 | hi1 << 16);
      }
      if (lane % 4 == 0) {
        float* rowf = reinterpret_cast<float*>(smem + kRowF) + pb * kRows;
        rowf[row0] = f0;
        rowf[row1] = f1;
      }
    };
    // page c's softmax into P8 buffer (c - first) & 1, once PV(c - 2) is done with it, published at once ("pfull")
    auto softmax_page = [&](float (&s)[32], int c, auto&& between_passes) {
      const int i = c - first, pb = i & 1;
      if (i >= 2) mbar_wait(pempty + pb, ((i >> 1) - 1) & 1);
      if (c < unmasked_end) softmax_to_p8(s, c, pb, std::false_type{}, between_passes);
      else softmax_to_p8(s, c, pb, std::true_type{}, between_passes);
      fence_async_smem();  // P8 is read by the PV warpgroups' WGMMAs (async proxy)
      mbar_arrive(pfull + pb);
    };
    // Iteration c: QK(c + 1)'s first part is queued on the tensor cores, then page c's softmax runs on `cur` while
    // QK(c + 1) fills `nxt` and `nxt2` (its two parts), summed into `cur` at the end. P8(c) is published as soon as
    // it is written: held until QK(c + 2) is issued, as the tensor cores' order would suggest, it makes PV(c) and the
    // transposes that free the stages wait on this warpgroup's wait for the next page (1-3 % slower on an H200).
    // The copy keeps the loop body one uniform step: two register sets would need a loop unrolled by two with a
    // conditional odd page, a branch around a WGMMA, which makes ptxas serialize every WGMMA of the kernel (C7514).
    // The last page is peeled.
    float cur[32], nxt[32], nxt2[32];
    if (n_mine > 0) {
      mbar_wait(full, 0);
      issue_qk(cur, nxt2, first);
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 32; ++j) cur[j] += nxt2[j];
      for (int c = first; c + 1 < last; ++c) {
        mbar_wait(full + stage_index(c + 1), use_parity(c + 1));
        issue_qk_part(nxt, c + 1, std::integral_constant<int, 0>{});
        softmax_page(cur, c, [&] { issue_qk_part(nxt2, c + 1, std::integral_constant<int, 1>{}); });
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 32; ++j) cur[j] = nxt[j] + nxt2[j];
      }
      softmax_page(cur, last - 1, [] {});
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {  // the row's denominator: the sum of its four threads' partials
      l0 += __shfl_xor_sync(0xffffffff, l0, x);
      l1 += __shfl_xor_sync(0xffffffff, l1, x);
    }
    if (lane % 4 == 0) {  // O and l share their units, so the output is O / l; the LSE is log2 of l x 2^ref / 448
      // l = 0: the row sees no key (out 0, LSE -inf); a NaN l (a non-finite key or query it sees) stays NaN
      rows_s[row0] = l0 != 0.f ? 1.f / l0 : 0.f;
      rows_s[row1] = l1 != 0.f ? 1.f / l1 : 0.f;
      rows_l[row0] = l0 != 0.f ? ref0 + log2f(l0) - kLog2Fp8Max : -INFINITY;
      rows_l[row1] = l1 != 0.f ? ref1 + log2f(l1) - kLog2Fp8Max : -INFINITY;
    }
    __syncthreads();  // (1) row scales published
    if (lane % 4 == 0) {
      // lse_out [B, H, s_q], natural log (the combine's output layout); row r of the tile is (token r / H, head r % H)
      auto store_lse = [&](int grow, float lse2) {
        if (grow >= R) return;
        if (kFinal) lse_out[((int64_t)b * H + grow % H) * S_Q + grow / H] = lse2 * 0.6931471805599453f;
        else lse_part[((int64_t)b * R + grow) * part_slots + split] = lse2;
      };
      store_lse(grow0, rows_l[row0]);
      store_lse(grow1, rows_l[row1]);
    }
  } else {
    // ---- PV warpgroups: wg 1 owns output columns 0..255, wg 2 columns 256..511 ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kPvRegs));
    const int half = wg - 1;
    uint8_t* vt = smem + kVT + half * kVTHalfBytes;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    int next_page = t == 128 && first + kStages < last ? bt[first + kStages] : 0;  // the loader thread's next page
    for (int c = first; c < last; ++c) {
      const int i = c - first, pb = i & 1, buf = stage_index(c), valid = valid_of(c);
      mbar_wait(full + buf, use_parity(c));
      if (valid == kPage) transpose_half<false>(stage_of(c), vt, half, tw, valid);
      else transpose_half<true>(stage_of(c), vt, half, tw, valid);
      fence_async_smem();  // V^T: generic stores, read by this warpgroup's WGMMA; the stage: read before a TMA rewrite
      if (half == 0) bar_sync<1, 128>();  // the whole V^T half is written
      else bar_sync<2, 128>();
      if (tw == 0) {
        mbar_arrive(empty + buf);  // this half of the page is transposed
        if (half == 0 && c + kStages < last) {  // wg 1 refills the stage once QK(c) and both halves are done with it
          mbar_wait(empty + buf, use_parity(c));
          load_page(stage_of(c), full + buf, &map_kv, &map_rope, kv_scale, next_page);
          next_page = c + kStages + 1 < last ? bt[c + kStages + 1] : 0;
        }
      }
      mbar_wait(pfull + pb, (i >> 1) & 1);
      const float* rowf = reinterpret_cast<const float*>(smem + kRowF) + pb * kRows;
      const float f0 = rowf[row0], f1 = rowf[row1];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= f0;
        o[4 * j + 1] *= f0;
        o[4 * j + 2] *= f1;
        o[4 * j + 3] *= f1;
      }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kPage / 32; ++k)
        wgmma_m64n256k32_e4m3(o, smem_desc(smem + kP8 + pb * kP8Bytes + k * 256, (kPage / 16) * 128),
                              smem_desc(vt + k * 256, kVTStride), 1);
      wgmma_commit();
      wgmma_wait<0>();
      mbar_arrive(pempty + pb);
    }
    __syncthreads();  // (1) row scales published
    const float w0 = rows_s[row0], w1 = rows_s[row1];
    if constexpr (kFinal) {
      // bf16, rounded to nearest like the combine's cast; out [B, s_q, H, 512] = [B, R, 512]. The tile goes through
      // shared memory (the stages are free: every page has been consumed) in the 128 B-swizzled layout of the Q
      // and K tiles (conflict-free: a warp's store covers 8 rows x 16 B, one chunk per bank group), then each
      // warpgroup's first thread writes its 4 [64 x 64] boxes by TMA. Stored from registers, they were 64 four-byte
      // STG per thread that the LSU queue throttled and that the CTA waited out at exit, while no other CTA
      // could use the SM (docs/BENCHMARKS.md, profile: ~10 % of the samples at h128 b512 s_k 1 024).
      uint8_t* otile = smem + kStage0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int byte = (half * 256 + j * 8 + (lane % 4) * 2) * 2;
        *reinterpret_cast<__nv_bfloat162*>(otile + sw128(row0, byte)) =
            __floats2bfloat162_rn(o[4 * j] * w0, o[4 * j + 1] * w0);
        *reinterpret_cast<__nv_bfloat162*>(otile + sw128(row1, byte)) =
            __floats2bfloat162_rn(o[4 * j + 2] * w1, o[4 * j + 3] * w1);
      }
      fence_async_smem();  // generic stores, read by the TMA store (async proxy)
      if (half == 0) bar_sync<1, 128>();
      else bar_sync<2, 128>();
      if (tw == 0) {
#pragma unroll
        for (int box = 4 * half; box < 4 * half + 4; ++box)
          tma_store_3d(&map_out, otile + box * kTile, box * 64, tile * kRows, b);
        bulk_store_commit_wait_read();
      }
    } else {  // the split partials, fp32 [B, R, part_slots, 512] (splits 0..num_splits-1), merged by the combine
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        int col = half * 256 + j * 8 + (lane % 4) * 2;
        if (grow0 < R) {
          float* dst = o_part + (((int64_t)b * R + grow0) * part_slots + split) * kLatent + col;
          *reinterpret_cast<float2*>(dst) = make_float2(o[4 * j] * w0, o[4 * j + 1] * w0);
        }
        if (grow1 < R) {
          float* dst = o_part + (((int64_t)b * R + grow1) * part_slots + split) * kLatent + col;
          *reinterpret_cast<float2*>(dst) = make_float2(o[4 * j + 2] * w1, o[4 * j + 3] * w1);
        }
      }
    }
  }
#endif
}

// ---- The narrow decode: sequences of at most kN (16 or 32) query rows (R = S_Q x H) ----
// At 16 heads (DeepSeek-V3 at TP 8) the wide kernel's 64-row tiles are three quarters empty, and QK, the softmax and
// PV do four times the work the rows need. Here the roles of WGMMA's operands are swapped: the page's 64 key tokens
// (QK) and the latent channels (PV) are M, the query rows are N = kN:
//   S^T [64 tokens x kN] = K8 Q8^T + K_rope' Q_rope'^T   (A = the staged page, B = Q, both from shared memory as TMA
//                                                         wrote them: 16 x m64nNk32 e4m3 + 4 x m64nNk16 bf16)
//   O^T [512 x kN] = O^T f + V^T P8^T                    (A = V^T in registers: the wide kernel's transpose reads,
//                                                         kept as A fragments, transpose_half_fragments; B = P8
//                                                         [kN x 64 tokens]; per PV warpgroup 4 M tiles of 64
//                                                         channels x 2 K steps of m64nNk32 e4m3; two fragment
//                                                         sets by page parity, so that V^T(c + 1) is read and
//                                                         permuted while PV(c)'s MMAs run)
// The numerics are the wide kernel's (the same log-domain softmax, page references, P8 and row factors); what
// changes is that a query row's scores now lie in one accumulator column spread over the warpgroup's four warps, so
// the page maximum is reduced across lanes (shuffles) and across warps (shared memory, one named barrier per page),
// and l at the end the same way. Each thread holds two tokens (16 w + lane / 4 and + 8) of kN / 4 query rows.
// Q takes kN rows of shared memory instead of 64, which leaves room for a fourth page stage. After the page loop no
// block-wide barrier either: the row scales reach the PV warpgroups through an mbarrier ("rows_done", arrived by the
// softmax warpgroup's warp 0, whose lanes also write the LSE rows).
template <int kN>
struct NarrowSmem {
  static constexpr int kStages = 4;
  static constexpr int kCols = kN / 4, kAcc = kN / 2;     // per thread: query rows, accumulators of an M x kN tile
  static constexpr int kQTile = kN * 128;                 // one [kN rows x 128 B] swizzled tile (8-row atoms)
  static constexpr int kQ8 = 0;                           // 4 tiles
  static constexpr int kQR = kQ8 + 4 * kQTile;            // 1 tile
  static constexpr int kStage0 = kQR + kQTile;            // kStages x kStagePitch; 1024 B aligned (kQTile is)
  static constexpr int kP8Bytes = kN * kPage;             // one P8 [kN rows x 64 B], K-major core matrices
  static constexpr int kP8 = kStage0 + kStages * kStagePitch;  // 2 buffers (page parity); V^T lives in registers
  static constexpr int kRowF = kP8 + 2 * kP8Bytes;        // 2 x [kN] fp32 O rescale factors
  static constexpr int kRed = kRowF + 2 * kN * 4;         // 2 x [kN][4 warps] fp32: page maxima, then l
  static constexpr int kRowS = kRed + 2 * 4 * kN * 4;     // [kN] fp32 1 / l
  static constexpr int kRowL = kRowS + kN * 4;            // [kN] fp32 base-2 LSE
  static constexpr int kBar = kRowL + kN * 4;  // full / empty per stage, pfull / pempty per P8, qfull, rows_done
  static constexpr int kBytes = kBar + (2 * kStages + 6) * 8 + 1024;
  static_assert(kQTile % 1024 == 0 && kRed % 16 == 0 && kBar % 8 == 0, "narrow decode: shared-memory alignment");
  static_assert(kBytes <= 227 * 1024, "narrow decode: shared memory over the sm_90 per-CTA limit");
  static_assert(8 * kQTile <= kStages * kStagePitch, "the bf16 output tile [kN x 1024 B] reuses the stages");
};

template <int kN>
__device__ __forceinline__ void wgmma_narrow_e4m3(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (kN == 16) wgmma_m64n16k32_e4m3(d, desc_a, desc_b, accumulate);
  else wgmma_m64n32k32_e4m3(d, desc_a, desc_b, accumulate);
}
template <int kN>
__device__ __forceinline__ void wgmma_narrow_e4m3_rs(float* d, const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  if constexpr (kN == 16) wgmma_m64n16k32_e4m3_rs(d, a, desc_b, accumulate);
  else wgmma_m64n32k32_e4m3_rs(d, a, desc_b, accumulate);
}
template <int kN>
__device__ __forceinline__ void wgmma_narrow_bf16(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (kN == 16) wgmma_m64n16k16_bf16(d, desc_a, desc_b, accumulate);
  else wgmma_m64n32k16_bf16(d, desc_a, desc_b, accumulate);
}

// The narrow softmax's row reductions over a warp: a query row's 16 tokens of the warp lie in the 8 lanes of equal
// lane % 4, and a thread holds kCols rows (kN / 4). A plain butterfly costs 3 shuffles per row; here, at each step
// (lane distance 4, then 8, then 16) a lane keeps half of the rows it still carries and receives the partner's
// partials of them: kCols - 1 shuffles in all (kCols = 8; at kCols = 4 the last step is a plain one, 4 in all). The
// distances go in the butterfly's order, so every partial is the same sum a butterfly forms (fp32 adds commute):
// results are bit-identical to it. Afterwards the lane holds the warp's reduction of its row index
// `reduced_index<kCols>(lane)` (at kCols = 4 the lanes 16 apart hold the same one).
template <int kCols>
__device__ __forceinline__ int reduced_index(int lane) {
  const int b2 = (lane >> 2) & 1, b3 = (lane >> 3) & 1, b4 = (lane >> 4) & 1;
  return kCols == 8 ? 4 * b2 + 2 * b3 + b4 : 2 * b2 + b3;
}
// The lane of this lane's warp (same lane % 4, i.e. the same query rows) that holds the reduction of row index i
template <int kCols>
__device__ __forceinline__ int reducing_lane(int i, int lane) {
  return kCols == 8 ? (lane & 3) | ((i >> 2) << 2) | (((i >> 1) & 1) << 3) | ((i & 1) << 4)
                    : (lane & 3) | ((i >> 1) << 2) | ((i & 1) << 3);
}
template <int kCols, typename Op>
__device__ __forceinline__ float reduce_rows_by_halves(const float (&v)[kCols], int lane, Op op) {
  static_assert(kCols == 4 || kCols == 8, "narrow decode: 4 or 8 query rows per thread");
  const bool b2 = lane & 4, b3 = lane & 8, b4 = lane & 16;
  float a[kCols / 2], c[kCols / 4];
#pragma unroll
  for (int k = 0; k < kCols / 2; ++k) {
    const float keep = b2 ? v[kCols / 2 + k] : v[k], send = b2 ? v[k] : v[kCols / 2 + k];
    a[k] = op(keep, __shfl_xor_sync(0xffffffff, send, 4));
  }
#pragma unroll
  for (int k = 0; k < kCols / 4; ++k) {
    const float keep = b3 ? a[kCols / 4 + k] : a[k], send = b3 ? a[k] : a[kCols / 4 + k];
    c[k] = op(keep, __shfl_xor_sync(0xffffffff, send, 8));
  }
  if constexpr (kCols == 8) {
    const float keep = b4 ? c[1] : c[0], send = b4 ? c[0] : c[1];
    return op(keep, __shfl_xor_sync(0xffffffff, send, 16));
  } else {
    return op(c[0], __shfl_xor_sync(0xffffffff, c[0], 16));
  }
}

template <int kN, bool kFinal>
__global__ void __launch_bounds__(kThreads, 1) decode_narrow_sm90_kernel(
    const __grid_constant__ CUtensorMap map_kv, const __grid_constant__ CUtensorMap map_rope,
    const __grid_constant__ CUtensorMap map_q8, const __grid_constant__ CUtensorMap map_qr,
    const __grid_constant__ CUtensorMap map_out, const float* __restrict__ q_scale,
    const float* __restrict__ kv_scale, const int* __restrict__ block_table, const int* __restrict__ seq_lens,
    float* __restrict__ o_part, float* __restrict__ lse_part, float* __restrict__ lse_out, int stride_bt,
    int64_t bt_entries, int R, int H, int S_Q, float qk_scale_log2, int num_splits, int part_slots,
    int kv_before_wait) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using L = NarrowSmem<kN>;
  // (kCols and kAcc are members of L: as local constants, read inside the lambdas, they crash nvcc 13.0's front end)
  constexpr int kSt = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int b = blockIdx.y, split = blockIdx.z;
  const int t = threadIdx.x, wg = t / 128, tw = t % 128, warp = tw / 32, lane = tw % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBar);
  uint64_t* empty = full + kSt;
  uint64_t* pfull = empty + kSt;
  uint64_t* pempty = pfull + 2;
  uint64_t* qfull = pempty + 2;
  uint64_t* rows_done = qfull + 1;  // the row scales (1 / l) published by the softmax warpgroup's warp 0
  if (t == 0) {
    for (int i = 0; i < kSt; ++i) mbar_init(full + i, kTmaArrivals), mbar_init(empty + i, kStageReleases);
    for (int i = 0; i < 2; ++i) mbar_init(pfull + i, kP8Publishers), mbar_init(pempty + i, kP8Consumers);
    mbar_init(qfull, kTmaArrivals);
    mbar_init(rows_done, kRowScalePublishers);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int* bt = block_table + (int64_t)b * stride_bt;
  const int64_t bt_readable = bt_entries - (int64_t)b * stride_bt;
  // the same prologue as the wide kernel (PDL, first pages before the wait after the Q quantization)
  if (kv_before_wait && t == 0)
    load_first_pages<kSt>(smem + L::kStage0, full, &map_kv, &map_rope, kv_scale, bt, seq_lens[b], split, num_splits,
                          bt_readable);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (t == 32) {  // Q [kN rows] by TMA; rows past R are zero-filled
    mbar_expect_tx(qfull, 5 * L::kQTile);
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) tma_load_3d(smem + L::kQ8 + blk * L::kQTile, &map_q8, blk * 128, 0, b, qfull);
    tma_load_3d(smem + L::kQR, &map_qr, 0, 0, b, qfull);
  }
  if (!kv_before_wait && t == 0)
    load_first_pages<kSt>(smem + L::kStage0, full, &map_kv, &map_rope, kv_scale, bt, seq_lens[b], split, num_splits,
                          bt_readable);
  const int seq_len = seq_lens[b];
  int first, last;
  split_pages(seq_len, split, num_splits, first, last);
  if (!kFinal && first >= last) {  // a split without pages: LSE -inf, no partial rows (see the wide kernel)
    if (t < R) lse_part[((int64_t)b * R + t) * part_slots + split] = -INFINITY;
    if (t == 32) mbar_wait(qfull, 0);
    return;
  }
  const int n_mine = last - first;
  auto stage_index = [&](int page) { return (page - first) % kSt; };
  auto stage_of = [&](int page) { return smem + L::kStage0 + stage_index(page) * kStagePitch; };
  auto use_parity = [&](int page) { return ((page - first) / kSt) & 1; };
  auto valid_of = [&](int page) { return min(kPage, seq_len - page * kPage); };
  // accumulator layout (every M x kN accumulator here): register 4 j + 2 h + c of a thread is M row
  // 16 warp + lane / 4 + 8 h and column (query row) 8 j + 2 (lane % 4) + c; `col(i)` is the query row of this
  // thread's i-th column (j = i / 2, c = i % 2) and `acc(i, h)` its register
  auto col = [&](int i) { return 8 * (i / 2) + 2 * (lane % 4) + (i % 2); };
  auto acc = [](int i, int h) { return 4 * (i / 2) + 2 * h + (i % 2); };
  float* rows_s = reinterpret_cast<float*>(smem + L::kRowS);
  float* rows_l = reinterpret_cast<float*>(smem + L::kRowL);

  if (wg == 0) {
    // ---- softmax warpgroup: QK(c + 1) on the tensor cores while page c's softmax runs here ----
    // registers at N = 32: kNarrowSoftmaxRegs here, the rest of the launch's 3 x 168 to the PV warpgroups (their two
    // V^T fragment sets and 64 accumulators; at N = 16 both fit in 168)
    if constexpr (kN == 32) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kNarrowSoftmaxRegs));
    const int tok0 = 16 * warp + lane / 4;  // this thread's page tokens: tok0, tok0 + 8
    float qs[L::kCols], l[L::kCols];
    int last_key[L::kCols];
#pragma unroll
    for (int i = 0; i < L::kCols; ++i) {
      const int n = col(i);
      qs[i] = n < R ? q_scale[(int64_t)b * R + n] * qk_scale_log2 : 0.f;
      last_key[i] = seq_len - S_Q + n / H;
      l[i] = 0.f;
    }
    // the query row whose page maxima (and, at the end, l) this lane reduces: its running maximum and page
    // reference live here only; the row's other lanes receive the reference and factor by shuffles
    const int own = col(reduced_index<L::kCols>(lane));
    const bool own_store = kN == 32 || !(lane & 16);  // at kN = 16 lanes 16 apart reduce the same row
    float own_ref = kNoRef, own_run = -INFINITY;
    const int unmasked_end = (seq_len - S_Q + 1) / kPage;
    mbar_wait(qfull, 0);
    const uint64_t desc_q = smem_desc_sw128(smem + L::kQ8), desc_qr = smem_desc_sw128(smem + L::kQR);
    auto issue_qk = [&](float (&s)[L::kAcc], int page) {
      const uint64_t desc_k = smem_desc_sw128(stage_of(page));
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kLatent / 32; ++k)
        wgmma_narrow_e4m3<kN>(s, desc_k + (((k / 4) * kTile + (k % 4) * 32) >> 4),
                              desc_q + (((k / 4) * L::kQTile + (k % 4) * 32) >> 4), k != 0);
#pragma unroll
      for (int k = 0; k < kRope * 2 / 32; ++k)
        wgmma_narrow_bf16<kN>(s, desc_k + ((4 * kTile + k * 32) >> 4), desc_qr + ((k * 32) >> 4), 1);
      wgmma_commit();
    };
    // P8 [kN rows x 64 tokens] K-major (query row n at (n / 8) x 512 + (n % 8) x 16, the 16-token group g at
    // g x 128), tokens inside a group in the V^T slot order (transpose_half: slots 4m..4m+3 hold tokens 2m, 2m + 1,
    // 2m + 8, 2m + 9). Those four bytes of a row come from two lanes (tok0 = 2m and 2m + 1: lanes 4 apart), so the
    // lanes trade one row's pair per two rows and each stores one 32-bit word: lane bit 2 (`odd`) picks the row
    // of the two (8 j + 2 (lane % 4) + odd) and the word's byte order. A store's 32 lanes hit 32 banks.
    const bool odd = lane & 4;
    const uint32_t p8_word = (2 * (lane % 4) + odd) * 16 + warp * 128 + 4 * (lane / 8);
    const uint32_t p8_order = odd ? 0x1504 : 0x5140;  // {this lane's pair, the partner's} -> tokens 2m, 2m+1, 2m+8, 2m+9
    auto softmax_to_p8 = [&](float (&s)[L::kAcc], int page, int pb, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const float* ks = reinterpret_cast<const float*>(stage_of(page) + 5 * kTile);
      const int valid = valid_of(page);
      float ksc[2], lg[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ksc[h] = !kMasked || tok0 + 8 * h < valid ? ks[tok0 + 8 * h] : 0.f;
        lg[h] = fast_log2(ksc[h]);  // -inf past the sequence end
      }
      // the token scales were the stage's last bytes this warpgroup reads (QK(page) has completed): release it now,
      // so that the page four ahead is requested while this page's softmax runs
      mbar_arrive(empty + stage_index(page));
      float pm[L::kCols];
#pragma unroll
      for (int i = 0; i < L::kCols; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float x = fmaf(s[acc(i, h)] * ksc[h], qs[i], lg[h]);
          if (kMasked) {  // also replaces whatever an unwritten tail made of S (NaN x 0) by -inf
            const int key = page * kPage + tok0 + 8 * h;
            x = (key <= last_key[i] && col(i) < R) ? x : -INFINITY;
          }
          s[acc(i, h)] = x;
        }
        pm[i] = fmaxf(s[acc(i, 0)], s[acc(i, 1)]);
      }
      // the page maximum of each query row: over the warp's 16 tokens, then over the 4 warps through shared memory,
      // a row's four warp maxima adjacent (one 16 B load). Page parity: a buffer is rewritten two pages later, after
      // every thread has passed the next page's barrier.
      const float warp_max = reduce_rows_by_halves<L::kCols>(pm, lane, [](float x, float y) { return fmaxf(x, y); });
      float4* red = reinterpret_cast<float4*>(smem + L::kRed) + pb * kN;
      if (own_store) reinterpret_cast<float*>(red + own)[warp] = warp_max;
      bar_sync<3, kWarpgroup>();
      // the lane's own row: page reference and the factor taking O and l to its units, once per warp and row
      const float4 wm = red[own];
      const float page_max = fmaxf(fmaxf(wm.x, wm.y), fmaxf(wm.z, wm.w));
      own_run = fmaxf(own_run, page_max);
      const float nr = page_reference(page_max, own_run);
      const float own_f = fast_exp2(own_ref - nr), own_bias = nr - kLog2Fp8Max;
      own_ref = nr;
      float inv_k[2];  // P = P8 / sigma_k, for the denominator; 0 past the sequence end
#pragma unroll
      for (int h = 0; h < 2; ++h) inv_k[h] = kMasked && !(ksc[h] > 0.f) ? 0.f : fast_rcp(ksc[h]);
      uint32_t pair[L::kCols];  // tokens tok0 (low byte) and tok0 + 8 of each row
#pragma unroll
      for (int i = 0; i < L::kCols; ++i) {
        const int from = reducing_lane<L::kCols>(i, lane);
        const float bias = __shfl_sync(0xffffffff, own_bias, from), f = __shfl_sync(0xffffffff, own_f, from);
        float sp = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p = fast_exp2(s[acc(i, h)] - bias);
          sp = fmaf(p, inv_k[h], sp);
          s[acc(i, h)] = p;
        }
        l[i] = fmaf(l[i], f, sp);
        pair[i] = to_fp8x2(s[acc(i, 0)], s[acc(i, 1)]);
      }
      const uint32_t p8 = smem_u32(smem + L::kP8 + pb * L::kP8Bytes);
#pragma unroll
      for (int j = 0; j < L::kCols / 2; ++j) {
        const uint32_t partner = __shfl_xor_sync(0xffffffff, odd ? pair[2 * j] : pair[2 * j + 1], 4);
        st_shared_u32(p8 + j * 512 + p8_word, __byte_perm(odd ? pair[2 * j + 1] : pair[2 * j], partner, p8_order));
      }
      if (warp == 0 && own_store) reinterpret_cast<float*>(smem + L::kRowF)[pb * kN + own] = own_f;
    };
    auto softmax_page = [&](float (&s)[L::kAcc], int c) {
      const int i = c - first, pb = i & 1;
      if (i >= 2) mbar_wait(pempty + pb, ((i >> 1) - 1) & 1);
      if (c < unmasked_end) softmax_to_p8(s, c, pb, std::false_type{});
      else softmax_to_p8(s, c, pb, std::true_type{});
      fence_async_smem();  // P8 is read by the PV warpgroups' WGMMAs (async proxy)
      // published at once: PV(c) and the PV warpgroups' transpose of page c + 1 (which frees its stage for the load
      // four pages ahead) then overlap this warpgroup's wait for page c + 2, instead of following it
      mbar_arrive(pfull + pb);
    };
    float cur[L::kAcc], nxt[L::kAcc];
    if (n_mine > 0) {
      mbar_wait(full, 0);
      issue_qk(cur, first);
      wgmma_wait<0>();
      for (int c = first; c + 1 < last; ++c) {
        mbar_wait(full + stage_index(c + 1), use_parity(c + 1));
        issue_qk(nxt, c + 1);
        softmax_page(cur, c);
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < L::kAcc; ++j) cur[j] = nxt[j];
      }
      softmax_page(cur, last - 1);
    }
    // l of each query row: over the warp's lanes, then the 4 warps (the buffer of parity n_mine: every thread has
    // passed the last page's barrier, so nobody reads it any more)
    const float warp_l = reduce_rows_by_halves<L::kCols>(l, lane, [](float x, float y) { return x + y; });
    float4* red = reinterpret_cast<float4*>(smem + L::kRed) + (n_mine & 1) * kN;
    if (own_store) reinterpret_cast<float*>(red + own)[warp] = warp_l;
    bar_sync<3, kWarpgroup>();
    // warp 0's lanes hold every query row's reference (own_store lanes: each row once)
    if (warp == 0) {
      const float4 wl = red[own];
      const float lsum = (wl.x + wl.y) + (wl.z + wl.w);
      // l = 0: the row sees no key (out 0, LSE -inf); a NaN l stays NaN
      const float inv = lsum != 0.f ? 1.f / lsum : 0.f;
      const float lse2 = lsum != 0.f ? own_ref + log2f(lsum) - kLog2Fp8Max : -INFINITY;
      if (own_store) rows_s[own] = inv, rows_l[own] = lse2;
      __syncwarp();
      // every lane arrives: an arrival releases the arriving thread's own stores, and the own_store lanes made them
      mbar_arrive(rows_done);
      if (t < R) {  // R <= kN <= 32: warp 0's lanes, which the __syncwarp above ordered after the stores
        if (kFinal) lse_out[((int64_t)b * H + t % H) * S_Q + t / H] = rows_l[t] * 0.6931471805599453f;
        else lse_part[((int64_t)b * R + t) * part_slots + split] = rows_l[t];
      }
    }
  } else {
    // ---- PV warpgroups: wg 1 owns latent channels 0..255, wg 2 channels 256..511 ----
    if constexpr (kN == 32) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kNarrowPvRegs));
    const int half = wg - 1;
    float o[4][L::kAcc];  // O^T: 4 M tiles of 64 channels (narrow_pv_channel) x kN query rows
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int j = 0; j < L::kAcc; ++j) o[mt][j] = 0.f;
    int next_page = t == 128 && first + kSt < last ? bt[first + kSt] : 0;  // the loader thread's next page
    using Frags = uint32_t[4][2][4];  // V^T(c) as A fragments: [M tile][K step][register]
    // V^T(c) into `a`, then the stage back to the loader
    auto fragments_of = [&](int c, Frags& a) {
      const int buf = stage_index(c), valid = valid_of(c);
      mbar_wait(full + buf, use_parity(c));
      if (valid < kPage) transpose_half_fragments<true>(stage_of(c), half, tw, valid, a);  // the last page
      else transpose_half_fragments<false>(stage_of(c), half, tw, valid, a);
      // the half's reads of the stage are done: one thread gives it back (the permutes consumed every load)
      if (half == 0) bar_sync<1, 128>();
      else bar_sync<2, 128>();
      if (tw == 0) {
        mbar_arrive(empty + buf);
        if (half == 0 && c + kSt < last) {
          mbar_wait(empty + buf, use_parity(c));
          load_page(stage_of(c), full + buf, &map_kv, &map_rope, kv_scale, next_page);
          next_page = c + kSt + 1 < last ? bt[c + kSt + 1] : 0;
        }
      }
    };
    // PV(c) issued (not waited for): O rescaled by the page factors, then O^T += V^T(c) P8(c)^T
    auto issue_pv = [&](int c, const Frags& a) {
      const int pb = (c - first) & 1;
      mbar_wait(pfull + pb, ((c - first) >> 1) & 1);
      const float* rowf = reinterpret_cast<const float*>(smem + L::kRowF) + pb * kN;
#pragma unroll
      for (int ii = 0; ii < L::kCols; ++ii) {
        const float f = rowf[col(ii)];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) o[mt][acc(ii, 0)] *= f, o[mt][acc(ii, 1)] *= f;
      }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kPage / 32; ++k) {
        const uint64_t desc_p = smem_desc(smem + L::kP8 + pb * L::kP8Bytes + k * 256, (kPage / 16) * 128);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) wgmma_narrow_e4m3_rs<kN>(o[mt], a[mt][k], desc_p, 1);
      }
      wgmma_commit();
    };
    auto finish_pv = [&](int c) {  // PV(c)'s MMAs done: its P8 buffer back to the softmax warpgroup
      wgmma_wait<0>();
      mbar_arrive(pempty + ((c - first) & 1));
    };
    // two fragment sets by page parity: V^T(c + 1) is read and permuted while PV(c)'s MMAs run
    Frags fa, fb;
    if (first < last) fragments_of(first, fa);
    for (int c = first; c < last; c += 2) {
      issue_pv(c, fa);
      if (c + 1 < last) fragments_of(c + 1, fb);
      finish_pv(c);
      if (c + 1 >= last) break;
      issue_pv(c + 1, fb);
      if (c + 2 < last) fragments_of(c + 2, fa);
      finish_pv(c + 1);
    }
    mbar_wait(rows_done, 0);  // the row scales are published
    float w[L::kCols];
#pragma unroll
    for (int ii = 0; ii < L::kCols; ++ii) w[ii] = rows_s[col(ii)];
    if constexpr (kFinal) {
      // bf16 out [B, R, 512] through a [kN x 1024 B] tile in the stages (8 swizzled [kN x 128 B] boxes), then
      // each PV warpgroup's first thread stores its 4 boxes by TMA (rows past R clipped). The softmax warpgroup's
      // last read of a stage precedes its last P8 publication, which both PV warpgroups have waited for; the barrier
      // waits for the other PV warpgroup's last transpose out of the stages.
      bar_sync<4, 2 * kWarpgroup>();
      uint8_t* otile = smem + L::kStage0;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ch = narrow_pv_channel(half, mt, warp, lane, h), byte = (ch % 64) * 2;
#pragma unroll
          for (int ii = 0; ii < L::kCols; ++ii) {
            const int n = col(ii);
            *reinterpret_cast<__nv_bfloat16*>(otile + (ch / 64) * L::kQTile + n * 128 +
                                              ((((byte >> 4) & 7) ^ (n & 7)) << 4) + (byte & 15)) =
                __float2bfloat16_rn(o[mt][acc(ii, h)] * w[ii]);
          }
        }
      fence_async_smem();
      if (half == 0) bar_sync<1, 128>();
      else bar_sync<2, 128>();
      if (tw == 0) {
#pragma unroll
        for (int box = 4 * half; box < 4 * half + 4; ++box)
          tma_store_3d(&map_out, otile + box * L::kQTile, box * 64, 0, b);
        bulk_store_commit_wait_read();
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ch = narrow_pv_channel(half, mt, warp, lane, h);
#pragma unroll
          for (int ii = 0; ii < L::kCols; ++ii) {
            const int n = col(ii);
            if (n < R) o_part[(((int64_t)b * R + n) * part_slots + split) * kLatent + ch] = o[mt][acc(ii, h)] * w[ii];
          }
        }
    }
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

// A [B, R, row] row-major array (Q8, Q RoPE, out) seen as 3-D {row elements, R, B} in boxes of 128 B x box_rows x 1,
// 128 B swizzle: one box is one [box_rows x 128 B] tile of the kernel's shared layout (64 rows in the wide kernel,
// kN in the narrow one). Rows past R (the next sequence's) are zero-filled on load and clipped on store.
static bool encode_rows_map(CUtensorMap* map, const void* base, int batch, int R, int row_elems, int elem_bytes,
                            CUtensorMapDataType dtype, CUtensorMapL2promotion promotion, int box_rows) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(row_elems) * elem_bytes;
  cuuint64_t dims[3] = {static_cast<cuuint64_t>(row_elems), static_cast<cuuint64_t>(R), static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[2] = {row_bytes, static_cast<cuuint64_t>(R) * row_bytes};
  cuuint32_t box[3] = {static_cast<cuuint32_t>(128 / elem_bytes), static_cast<cuuint32_t>(box_rows), 1};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, dtype, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The narrow kernel's N for R query rows per sequence, 0 for the wide kernel (R > 32)
static int narrow_rows(int R) { return R <= 16 ? 16 : R <= 32 ? 32 : 0; }

template <typename Kernel>
static cudaError_t allow_smem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

cudaError_t launch_decode_split_sm90(const DecodeParams& p, cudaStream_t stream) {
  // out / lse_out (final outputs instead of partials) only with one split: there is nothing to merge then
  if ((p.out != nullptr) != (p.lse_out != nullptr) || (p.out != nullptr && p.num_splits != 1) ||
      (p.out == nullptr && p.part_slots < p.num_splits))
    return cudaErrorInvalidConfiguration;
  // once per process (SGLang runs one process per GPU; the attribute applies to the current device), outside the
  // per-launch path so that a CUDA-graph capture records only the kernel launch
  static cudaError_t attr = [] {
    cudaError_t e = allow_smem(decode_split_sm90_kernel<false, false>, kSmemBytes);
    if (e == cudaSuccess) e = allow_smem(decode_split_sm90_kernel<true, false>, kSmemBytes);
    if (e == cudaSuccess) e = allow_smem(decode_split_sm90_kernel<false, true>, kSmemBytes);
    if (e == cudaSuccess) e = allow_smem(decode_split_sm90_kernel<true, true>, kSmemBytes);
    if (e == cudaSuccess) e = allow_smem(decode_narrow_sm90_kernel<16, false>, NarrowSmem<16>::kBytes);
    if (e == cudaSuccess) e = allow_smem(decode_narrow_sm90_kernel<16, true>, NarrowSmem<16>::kBytes);
    if (e == cudaSuccess) e = allow_smem(decode_narrow_sm90_kernel<32, false>, NarrowSmem<32>::kBytes);
    if (e == cudaSuccess) e = allow_smem(decode_narrow_sm90_kernel<32, true>, NarrowSmem<32>::kBytes);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  const int narrow = narrow_rows(p.R), box_rows = narrow ? narrow : kRows;
  // Q from bf16 rows: the 64-row kernel only, and never with kv_before_wait (the previous kernel is then not ours)
  const bool quantize_q = p.q_nope != nullptr;
  if (quantize_q && (narrow || p.q_pe == nullptr || (p.launch_flags & kLaunchKvBeforeWait)))
    return cudaErrorInvalidValue;
  // The tensor maps are kernel parameters (host-side encoding, no device work): a captured graph replays them with
  // the addresses they were encoded with. The pool's stay fixed for the life of a server; Q and `out` inside a
  // captured graph come from the graph's memory pool (fixed for every replay), as pointer arguments would. Without
  // final outputs the output map is unused (zeroed).
  CUtensorMap map_kv, map_rope, map_q8 = {}, map_qr = {}, map_out = {};
  if (!encode_pool_map(&map_kv, p.kv_content, p.pool_rows, kLatent, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1) ||
      !encode_pool_map(&map_rope, p.kv_rope, p.pool_rows, kRope * 2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2) ||
      (!quantize_q && !encode_rows_map(&map_q8, p.q8, p.batch, p.R, kLatent, 1, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, box_rows)) ||
      (!quantize_q && !encode_rows_map(&map_qr, p.q_rope, p.batch, p.R, kRope, 2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, box_rows)) ||
      (p.out != nullptr && !encode_rows_map(&map_out, p.out, p.batch, p.R, kLatent, 2,
                                            CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                            box_rows)))
    return cudaErrorInvalidValue;
  const bool final_out = p.out != nullptr;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(narrow ? 1 : (p.R + kRows - 1) / kRows, p.batch, p.num_splits);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = narrow == 16 ? NarrowSmem<16>::kBytes : narrow == 32 ? NarrowSmem<32>::kBytes : kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = (p.launch_flags & kLaunchPdl) ? 1 : 0;
  config.attrs = attrs;
  config.numAttrs = 1;
  const int kv_before_wait = (p.launch_flags & kLaunchKvBeforeWait) ? 1 : 0;
  auto launch = [&](auto kernel, auto... extra) {
    return cudaLaunchKernelEx(&config, kernel, map_kv, map_rope, map_q8, map_qr, map_out, p.q_scale, p.kv_scale,
                              p.block_table, p.seq_lens, p.o_part, p.lse_part, p.lse_out,
                              static_cast<int>(p.stride_bt), p.bt_entries, static_cast<int>(p.R),
                              static_cast<int>(p.H), static_cast<int>(p.S_Q), p.qk_scale_log2,
                              static_cast<int>(p.num_splits), static_cast<int>(p.part_slots), kv_before_wait,
                              extra...);
  };
  if (narrow == 16)
    return launch(final_out ? decode_narrow_sm90_kernel<16, true> : decode_narrow_sm90_kernel<16, false>);
  if (narrow == 32)
    return launch(final_out ? decode_narrow_sm90_kernel<32, true> : decode_narrow_sm90_kernel<32, false>);
  const QBf16 qb = {static_cast<const __nv_bfloat16*>(p.q_nope), static_cast<const __nv_bfloat16*>(p.q_pe),
                    p.stride_qn_t, p.stride_qn_h, p.stride_qp_t, p.stride_qp_h};
  if (quantize_q)
    return launch(final_out ? decode_split_sm90_kernel<true, true> : decode_split_sm90_kernel<false, true>, qb);
  return launch(final_out ? decode_split_sm90_kernel<true, false> : decode_split_sm90_kernel<false, false>, qb);
}

}  // namespace snapmla
