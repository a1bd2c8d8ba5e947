// The grouped GEMM on Hopper's warpgroup MMA (sm_90a): the same GEMM as gemm_kernel (GemmArgs,
// tile lists, partial outputs, epilogue) for 32-, 64- and 128-token tiles (BT, the wgmma N; the
// text below says 128 for BT).
//
// A CTA is kWG consumer warpgroups (2, or 1 where a 2-warpgroup stage would not fit 3 times in
// shared memory) over kWG consecutive 128-row weight tiles and one 128-token tile, so the
// activation tile is shared. Per stage all threads copy (cp.async, STAGES deep, prefetch distance
// STAGES − 2) the activation rows into the 128-byte-swizzled K-major layout that wgmma reads
// through a shared-memory descriptor, and each warpgroup copies its weight tile and block scales
// in the layout of the mma.sync kernel. Each warp then builds its A fragments exactly as there
// (AFrag: the register decode of FP8 / FP4 / FP6) and the warpgroup issues
// wgmma.mma_async m64n128 with A from registers (two per k step: m-fragments 0 and 1 of the four
// warps), so the decode of step k + 1 overlaps the MMAs of step k. Accumulators are the
// mma.sync kernel's [2][16][4] (the D layout of m64nN is the m16n8 C layout per warp, repeated
// over N), and so is the epilogue (store_partials).
//
// BF16 and INT8 weights (128 bytes per row and stage) are stored 128B-swizzled as well and wgmma
// reads both operands from shared memory (one group per stage).
//
// Ordering: register-A wgmma groups are committed per k step; before a thread overwrites the A
// registers of a k step it waits until the group that read them is done (wait_group kDepth − 1),
// and before the CTA barrier of stage it every warpgroup has waited until only groups of stage
// it − 1 are in flight, so the copies issued after that barrier (into the buffer of stage it − 2)
// never overwrite data a wgmma still reads. cp.async writes reach the async proxy through
// fence.proxy.async before the barrier.
//
// CTAs are rasterised in strips of kStrip token tiles: consecutive CTAs take the strip's token
// tiles for one weight-tile pair, then the next pair, so one strip's activations and the weight
// tiles in flight stay in L2.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QMOE_WGMMA_DEVICE 1
#else
#define QMOE_WGMMA_DEVICE 0
#endif

#include "cuda/gemm_wgmma_host.h"

namespace qmoe::cuda {

// ---- PTX wrappers (sm_90a) ---------------------------------------------------------------------
// The accumulator operands of an m64nN wgmma (N / 2 per thread: d[0..N/2), constraint C).
#define QMOE_WG_ACC8(C, o) \
  C(d[o]), C(d[o + 1]), C(d[o + 2]), C(d[o + 3]), C(d[o + 4]), C(d[o + 5]), C(d[o + 6]), C(d[o + 7])
#define QMOE_WG_ACC16(C, o) QMOE_WG_ACC8(C, o), QMOE_WG_ACC8(C, o + 8)
#define QMOE_WG_ACC32(C, o) QMOE_WG_ACC16(C, o), QMOE_WG_ACC16(C, o + 16)
#define QMOE_WG_ACC48(C, o) QMOE_WG_ACC32(C, o), QMOE_WG_ACC16(C, o + 32)
#define QMOE_WG_ACC64(C, o) QMOE_WG_ACC32(C, o), QMOE_WG_ACC32(C, o + 32)

#define QMOE_WG_DREGS16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define QMOE_WG_DREGS32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define QMOE_WG_DREGS48 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define QMOE_WG_DREGS64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63}"

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle layout: rows of 128
// bytes, 8-row (1024-byte) atoms, the atom base 1024-aligned (start address in 16-byte units, bits
// 0–13; leading byte offset unused for this layout, 1; stride byte offset 1024 between 8-row
// groups, bits 32–45; layout type 1 = 128B swizzle, bits 62–63). A k step inside the 128-byte row
// advances the start address by its byte offset.
__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
// Byte offset of 16-byte chunk q of row r inside a 128-byte-swizzled block of rows.
__device__ __forceinline__ int sw128_offset(int r, int q) { return r * 128 + (sw128_chunk(r, q) << 4); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One wgmma.mma_async: INSTR (shape and types), DREGS / ACC (the N / 2 accumulators: operand
// list and constraints), then the A and B operands by their asm operand numbers, the scale-d
// predicate's operand number and the trailing immediates.
// Register A (this warp's 16 rows in the mma.sync A layout) and a B descriptor:
#define QMOE_WG_RS(INSTR, DREGS, ACC, AOPS, PRED)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned." INSTR " " DREGS ", " AOPS ", p, 1, 1, 0;\n}\n"      \
               : ACC                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1))
// A and B descriptors (TAIL: the bf16 scale / transpose immediates; none for s8):
#define QMOE_WG_SS(INSTR, DREGS, ACC, BOPS, PRED, TAIL)                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned." INSTR " " DREGS ", " BOPS ", p" TAIL ";\n}\n"      \
               : ACC                                                                              \
               : "l"(adesc), "l"(bdesc), "n"(1))

// D[64 × N] += A[64 × k] (registers) · B[k × N] (shared memory, descriptor), k = 16 (bf16 / f16,
// fp32 accumulate), N = 32, 64, 96 or 128 tokens (96: a 128-token tile's MMA narrowed to its
// tokens, wg_fit_n).
template <WFmt WF, int N>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc) {
  static_assert(N == 32 || N == 64 || N == 96 || N == 128, "token tiles of the wgmma kernel");
#if QMOE_WGMMA_DEVICE
  constexpr bool kF16 = AFrag<WF>::kF16;
  if constexpr (N == 96 && kF16)
    QMOE_WG_RS("m64n96k16.f32.f16.f16", QMOE_WG_DREGS48, QMOE_WG_ACC48("+f", 0),
               "{%48, %49, %50, %51}, %52", "%53");
  else if constexpr (N == 96)
    QMOE_WG_RS("m64n96k16.f32.bf16.bf16", QMOE_WG_DREGS48, QMOE_WG_ACC48("+f", 0),
               "{%48, %49, %50, %51}, %52", "%53");
  else if constexpr (N == 32 && kF16)
    QMOE_WG_RS("m64n32k16.f32.f16.f16", QMOE_WG_DREGS16, QMOE_WG_ACC16("+f", 0),
               "{%16, %17, %18, %19}, %20", "%21");
  else if constexpr (N == 32)
    QMOE_WG_RS("m64n32k16.f32.bf16.bf16", QMOE_WG_DREGS16, QMOE_WG_ACC16("+f", 0),
               "{%16, %17, %18, %19}, %20", "%21");
  else if constexpr (N == 64 && kF16)
    QMOE_WG_RS("m64n64k16.f32.f16.f16", QMOE_WG_DREGS32, QMOE_WG_ACC32("+f", 0),
               "{%32, %33, %34, %35}, %36", "%37");
  else if constexpr (N == 64)
    QMOE_WG_RS("m64n64k16.f32.bf16.bf16", QMOE_WG_DREGS32, QMOE_WG_ACC32("+f", 0),
               "{%32, %33, %34, %35}, %36", "%37");
  else if constexpr (kF16)
    QMOE_WG_RS("m64n128k16.f32.f16.f16", QMOE_WG_DREGS64, QMOE_WG_ACC64("+f", 0),
               "{%64, %65, %66, %67}, %68", "%69");
  else
    QMOE_WG_RS("m64n128k16.f32.bf16.bf16", QMOE_WG_DREGS64, QMOE_WG_ACC64("+f", 0),
               "{%64, %65, %66, %67}, %68", "%69");
#else
  (void)d, (void)a, (void)desc;
#endif
}

// D[64 × N] += A[64 × k] · B[k × N], both from shared memory (descriptors): BF16 (k16) and INT8
// (k32, int32 accumulate).
template <WFmt WF, int N, class Acc>
__device__ __forceinline__ void wgmma_ss(Acc* d, uint64_t adesc, uint64_t bdesc) {
  static_assert(N == 32 || N == 64 || N == 96 || N == 128, "token tiles of the wgmma kernel");
#if QMOE_WGMMA_DEVICE
  constexpr bool kI8 = WF == WFmt::INT8;
  if constexpr (N == 96 && kI8)
    QMOE_WG_SS("m64n96k32.s32.s8.s8", QMOE_WG_DREGS48, QMOE_WG_ACC48("+r", 0),
               "%48, %49", "%50", "");
  else if constexpr (N == 96)
    QMOE_WG_SS("m64n96k16.f32.bf16.bf16", QMOE_WG_DREGS48, QMOE_WG_ACC48("+f", 0),
               "%48, %49", "%50", ", 1, 1, 0, 0");
  else if constexpr (N == 32 && kI8)
    QMOE_WG_SS("m64n32k32.s32.s8.s8", QMOE_WG_DREGS16, QMOE_WG_ACC16("+r", 0),
               "%16, %17", "%18", "");
  else if constexpr (N == 32)
    QMOE_WG_SS("m64n32k16.f32.bf16.bf16", QMOE_WG_DREGS16, QMOE_WG_ACC16("+f", 0),
               "%16, %17", "%18", ", 1, 1, 0, 0");
  else if constexpr (N == 64 && kI8)
    QMOE_WG_SS("m64n64k32.s32.s8.s8", QMOE_WG_DREGS32, QMOE_WG_ACC32("+r", 0),
               "%32, %33", "%34", "");
  else if constexpr (N == 64)
    QMOE_WG_SS("m64n64k16.f32.bf16.bf16", QMOE_WG_DREGS32, QMOE_WG_ACC32("+f", 0),
               "%32, %33", "%34", ", 1, 1, 0, 0");
  else if constexpr (kI8)
    QMOE_WG_SS("m64n128k32.s32.s8.s8", QMOE_WG_DREGS64, QMOE_WG_ACC64("+r", 0),
               "%64, %65", "%66", "");
  else
    QMOE_WG_SS("m64n128k16.f32.bf16.bf16", QMOE_WG_DREGS64, QMOE_WG_ACC64("+f", 0),
               "%64, %65", "%66", ", 1, 1, 0, 0");
#else
  (void)d, (void)adesc, (void)bdesc;
#endif
}

// ---- geometry --------------------------------------------------------------------------------------
// BT tokens per CTA (wgmma N): 128 for prefill; 32 and 64 where the tile table picks them (BF16 /
// INT8 from the first token, FP8 in the mid range: gemm_wgmma_host.h).
template <WFmt WF, bool SPLIT, int BT_ = 128>
struct WgCfg {
  using WT = WTraits<WF>;
  static constexpr int BT = BT_;
  static_assert(BT == 32 || BT == 64 || BT == 128, "wgmma token tiles");
  static constexpr bool kInt8 = WF == WFmt::INT8;
  static constexpr int kARaw = kInt8 ? WT::kBK : 2 * WT::kBK;  // activation bytes per row per stage
  static constexpr int kAtoms = kARaw / 128;                    // 128-byte swizzle columns
  static constexpr int kATile = kAtoms * BT * 128;              // one operand (hi or lo)
  static constexpr int kAStage = kATile * (SPLIT ? 2 : 1);
  // BF16 / INT8 stages hold 128 bytes per weight row: the tile is stored 128B-swizzled like the
  // activations and wgmma reads A from shared memory too (no ldmatrix, no A registers).
  static constexpr bool kSS = !WT::kRegDecode;
  static_assert(!kSS || WT::kRaw == 128, "one swizzle row per weight row and stage");
  static constexpr int kW1 = kBW * (kSS ? 128 : WT::kStride);  // one warpgroup's weight tile
  static constexpr int kS1 = kBW * WT::kScale;   // and its block scales
  // 128- and 64-token tiles: one CTA per SM with all of shared memory; 32-token tiles: half of
  // it, two CTAs per SM (more copies in flight for the memory-bound mid range).
  static constexpr int kMinBlocks = BT <= 32 ? 2 : 1;
  static constexpr int kBudget = BT <= 32 ? 110 * 1024 : 220 * 1024;
  static constexpr int stage_bytes(int wg) { return (kAStage + wg * (kW1 + kS1) + 1023) / 1024 * 1024; }
  static constexpr int kWG = 3 * stage_bytes(2) <= kBudget ? 2 : 1;
  static constexpr int kStageBytes = stage_bytes(kWG);
  static constexpr int kStagesFit = kBudget / kStageBytes;
  static constexpr int kStages = kStagesFit > 6 ? 6 : kStagesFit;
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment of the base to 1024
  // The pipeline needs 3 stages (prefetch distance STAGES − 2); MXFP6 with the hi + lo split
  // (76 KB per one-warpgroup stage) does not fit and keeps the mma.sync kernel.
  static constexpr bool kSupported = kStagesFit >= 3;
  static_assert(kARaw % 128 == 0, "whole swizzle rows");
  // Register-A formats: the A fragments of kDepth k steps in flight (a k step reuses the registers
  // of the step kDepth before it, after wait_group kDepth − 1; kSteps is a multiple of kDepth, so
  // the rotation is the same in every stage; 2 with the hi + lo split, whose groups are twice as
  // long and whose registers are short). Shared-memory-A formats commit one group per stage.
  static constexpr int kDepth = kSS ? 1 : SPLIT ? 2 : 4;
  static constexpr int kInFlight = kSS ? 1 : kDepth - 1;
  static_assert(AFrag<WF>::kSteps % kDepth == 0, "A-register rotation");
};
constexpr int kStrip = 8;  // token tiles per rasterisation strip

// ---- MMAs as wide as the tile's tokens ---------------------------------------------------------
// A tile of cnt < BT tokens needs only the first columns of its MMAs (wgmma N = tokens): wg_fit_n
// is the width they run at — cnt rounded up to 32, BT where GemmArgs::fit_n is off — and
// wg_narrow calls f(std::integral_constant<int, N>) with that width as a compile-time constant. The
// D layout of m64nN repeats per 8 columns, so a narrower MMA's accumulators are the first N / 2
// registers of the wide one's; the columns past N keep their zeros, and no token of the tile reads
// them (store_partials stops at cnt). The tensor pipe's time per MMA is proportional to N.
template <int BT>
__device__ __forceinline__ int wg_fit_n(const GemmArgs& a, int cnt) {
  return a.fit_n ? min(BT, (cnt + 31) & ~31) : BT;
}
template <int BT, class F>
__device__ __forceinline__ void wg_narrow(int nw, const F& f) {
  if constexpr (BT >= 64) {
    if (nw <= 32) return f(std::integral_constant<int, 32>{});
  }
  if constexpr (BT >= 128) {
    if (nw <= 64) return f(std::integral_constant<int, 64>{});
    if (nw <= 96) return f(std::integral_constant<int, 96>{});
  }
  f(std::integral_constant<int, BT>{});
}

// ---- pieces of gemm_wg_kernel and gemm_ws_kernel ------------------------------------------------
// Strip rasterisation of (token tile x, weight-tile group y) over the linear CTA index.
// lin in [0, X · Y): X token tiles, Y weight-tile groups.
__device__ __forceinline__ void wg_raster(int lin, int X, int Y, int& tile, int& ty) {
  const int strip = lin / (kStrip * Y);
  const int width = min(kStrip, X - strip * kStrip);
  const int rem = lin - strip * kStrip * Y;
  tile = strip * kStrip + rem % width;
  ty = rem / width;
}
__device__ __forceinline__ void wg_cta_tile(int& tile, int& ty) {
  wg_raster(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, gridDim.y, tile, ty);
}

// The token tile's expert and token count; its tokens' slots and activation rows into shared
// memory (threads t = 0 … kThreads − 1; −1 past the count). Returns the tile's first position in
// the expert-ordered slot list (its first row in a tile-ordered operand, GemmArgs::a_tma).
template <int BT, int kThreads>
__device__ __forceinline__ int wg_tile_tokens(const GemmArgs& a, int tile, int t, int& e, int& cnt, int* s_slot,
                                              int* s_arow) {
  e = __ldcg(a.tile_expert + tile);
  const int m0 = __ldcg(a.tile_m0 + tile);
  cnt = min(BT, __ldcg(a.counts + e) - m0);
  const int base = __ldcg(a.offsets + e) + m0;
  for (int i = t; i < BT; i += kThreads) {
    const int slot = i < cnt ? __ldcg(a.sorted_slots + base + i) : -1;
    s_slot[i] = slot;
    s_arow[i] = slot < 0 ? -1 : slot / a.a_row_div;
  }
  return base;
}

// One 128-row weight tile of a k stage into `st` (wk: the tile's bytes at this stage, offset by
// this thread's 16), copied by one warpgroup (wtid: the thread's index in it) as it is stored: the
// fragment order of the register-decode formats, the 128B-swizzled rows of BF16 / INT8
// (cuda_common.h), both what the kernel reads.
template <class C>
__device__ __forceinline__ void wg_copy_weights(uint8_t* st, const uint8_t* wk, int wtid) {
  using WT = typename C::WT;
  static_assert(C::kW1 == kBW * WT::kRaw, "a stage's weight tile is stored as the kernel reads it");
  constexpr int kWPer = kBW * WT::kRaw / 16 / 128;
#pragma unroll
  for (int i = 0; i < kWPer; ++i) cp_async16(st + (wtid + i * 128) * 16, wk + i * 128 * 16);
}

// The activation rows of a k stage (koff: its byte offset in a row) into the swizzled layout
// [atom][row][128 bytes] of the hi (and, SPLIT, lo) operand, by threads t = 0 … kThreads − 1.
// kUnroll: the copy loop's unroll factor (0: whole).
template <class C, bool SPLIT, int kThreads, int kUnroll>
__device__ __forceinline__ void wg_copy_acts(const GemmArgs& a, uint8_t* adst, int64_t koff, int t, const int* s_arow) {
  constexpr int BT = C::BT;
  constexpr int kAChunksRow = C::kARaw / 16;
  constexpr int kAPer = BT * kAChunksRow / kThreads;
  constexpr int kU = kUnroll > 0 ? kUnroll : kAPer;
  static_assert(BT * kAChunksRow % kThreads == 0, "activation chunks per thread");
  const uint8_t* abase_hi = static_cast<const uint8_t*>(a.a_hi);
  const uint8_t* abase_lo = static_cast<const uint8_t*>(a.a_lo);
#pragma unroll(kU)
  for (int i = 0; i < kAPer; ++i) {
    const int c = t + i * kThreads;
    const int r = c / kAChunksRow, q = c % kAChunksRow;
    const int arow = s_arow[r];
    const int64_t src = static_cast<int64_t>(arow < 0 ? 0 : arow) * a.a_row_bytes + koff + q * 16;
    const int dst = (q >> 3) * (BT * 128) + sw128_offset(r, q);
    cp_async16_zfill(adst + dst, abase_hi + src, arow >= 0);
    if constexpr (SPLIT) cp_async16_zfill(adst + C::kATile + dst, abase_lo + src, arow >= 0);
  }
}

// One warpgroup's MMAs over a stage at shared address abase (activation operand of k step kk: atom
// kk / 4, byte offset 32 · (kk % 4) inside the swizzled row; the lo part, SPLIT, kATile further),
// with weight tile slot `cw` of the stage.
template <int BT>
__device__ __forceinline__ uint64_t wg_act_desc(uint32_t abase, int kk) {
  return wg_desc_sw128(abase + (kk >> 2) * (BT * 128) + (kk & 3) * 32);
}
// Shared-memory A (BF16, INT8): one group; weight rows 64·mt.. of the swizzled tile; MMAs nw wide
// (wg_fit_n).
template <WFmt WF, bool SPLIT, int BT, class Acc>
__device__ __forceinline__ void wg_mma_stage_ss(Acc (&acc)[2][BT / 8][4], uint32_t abase, int cw, int nw) {
  using C = WgCfg<WF, SPLIT, BT>;
  const uint32_t wbase = abase + C::kAStage + cw * C::kW1;
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < AFrag<WF>::kSteps; ++kk) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const uint64_t ad = wg_desc_sw128(wbase + mt * 64 * 128 + kk * 32);
      wg_narrow<BT>(nw, [&](auto n) {
        wgmma_ss<WF, decltype(n)::value>(&acc[mt][0][0], ad, wg_act_desc<BT>(abase, kk));
        if constexpr (SPLIT) wgmma_ss<WF, decltype(n)::value>(&acc[mt][0][0], ad, wg_act_desc<BT>(abase, kk) + (C::kATile >> 4));
      });
    }
  }
  wg_commit();
}
// Register A (the decode formats): the stage's fragment words loaded once, then per k step the
// decoded fragments into the registers of the step kDepth before (after that step's group is
// done) and one group; kSteps groups per stage; MMAs nw wide (wg_fit_n).
template <WFmt WF, bool SPLIT, int BT, class Acc>
__device__ __forceinline__ void wg_mma_stage_rs(Acc (&acc)[2][BT / 8][4], uint32_t (&af)[WgCfg<WF, SPLIT, BT>::kDepth][2][4],
                                                const uint8_t* st, int cw, int warp, int lane, int nw) {
  using C = WgCfg<WF, SPLIT, BT>;
  using F = AFrag<WF>;
  const uint32_t abase = smem_u32(st);
  F src;
  src.load(st + C::kAStage + cw * C::kW1, st + C::kAStage + C::kWG * C::kW1 + cw * C::kS1, warp, lane);
#pragma unroll
  for (int kk = 0; kk < F::kSteps; ++kk) {
    if (kk > 0) wg_wait<C::kInFlight>();  // the group that last read af[kk % kDepth] is done
    uint32_t (&f)[2][4] = af[kk % C::kDepth];
    src.get(kk, f);
    wg_fence();
    const uint64_t desc = wg_act_desc<BT>(abase, kk);
    wg_narrow<BT>(nw, [&](auto n) {
      wgmma_rs<WF, decltype(n)::value>(&acc[0][0][0], f[0], desc);
      wgmma_rs<WF, decltype(n)::value>(&acc[1][0][0], f[1], desc);
      if constexpr (SPLIT) {
        const uint64_t dlo = desc + (C::kATile >> 4);
        wgmma_rs<WF, decltype(n)::value>(&acc[0][0][0], f[0], dlo);
        wgmma_rs<WF, decltype(n)::value>(&acc[1][0][0], f[1], dlo);
      }
    });
    wg_commit();
  }
}

template <WFmt WF, bool SPLIT, int BT_>
__global__ void __launch_bounds__(WgCfg<WF, SPLIT, BT_>::kThreads, WgCfg<WF, SPLIT, BT_>::kMinBlocks)
    gemm_wg_kernel(const GemmArgs a) {
#if QMOE_WGMMA_DEVICE
  using C = WgCfg<WF, SPLIT, BT_>;
  using WT = typename C::WT;
  static_assert(C::kSupported, "3 pipeline stages must fit");
  constexpr int BT = C::BT, NT = BT / 8, S = C::kStages, D = S - 2;
  constexpr int kThreads = C::kThreads;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  __shared__ int s_arow[BT];
  __shared__ int s_slot[BT];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  int tile, ty;
  wg_cta_tile(tile, ty);
  if (a.tiles_after_wait) pdl_wait();  // align ran in the kernel just before (gemm_kernel)
  if (tile >= __ldcg(a.num_tiles)) return;
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  int e, cnt;
  wg_tile_tokens<BT, kThreads>(a, tile, tid, e, cnt, s_slot, s_arow);
  const int nw = wg_fit_n<BT>(a, cnt);
  const int wtile = ty * C::kWG + wg;  // this warpgroup's 128-row weight tile
  const bool wg_on = wtile < a.Npad / kBW;
  const int n0 = wtile * kBW;
  const int split = blockIdx.z;
  const int kt0 = split * a.kt_per_split;
  const int kt1 = min(a.Kt, kt0 + a.kt_per_split);
  const int nk = kt1 - kt0;

  // Weights: each warpgroup copies its own tile.
  const uint8_t* wsrc = a.w + e * a.w_expert_stride + static_cast<int64_t>(wtile) * a.Kt * (kBW * WT::kRaw) + wtid * 16;
  const uint8_t* sbase = nullptr;
  if constexpr (WT::kScale > 0) sbase = a.wscale + e * a.ws_expert_stride + static_cast<int64_t>(n0) * WT::kScale;
  auto load_w = [&](int buf, int kt) {
    if (!wg_on) return;
    uint8_t* st = smem + buf * C::kStageBytes + C::kAStage + wg * C::kW1;
    wg_copy_weights<C>(st, wsrc + static_cast<int64_t>(kt) * (kBW * WT::kRaw), wtid);
    if constexpr (WT::kScale > 0) {
      uint8_t* ss = smem + buf * C::kStageBytes + C::kAStage + C::kWG * C::kW1 + wg * C::kS1;
      const uint8_t* src = sbase + static_cast<int64_t>(kt) * a.Npad * WT::kScale;
      if (wtid < C::kS1 / 16) cp_async16(ss + wtid * 16, src + wtid * 16);
    }
  };
  // Activations: BT rows, by all threads.
  auto load_a = [&](int buf, int kt) {
    wg_copy_acts<C, SPLIT, kThreads, 0>(a, smem + buf * C::kStageBytes, static_cast<int64_t>(kt) * C::kARaw, tid, s_arow);
  };

  // Weight prologue (one group) before the wait for the activations' producer (launch.cuh), then
  // one group per activation stage: stage s is complete with groups 0 and s + 1.
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (s < nk) load_w(s, kt0 + s);
  cp_async_commit();
  pdl_wait();
  pdl_trigger();
  __syncthreads();  // s_slot / s_arow
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < nk) load_a(s, kt0 + s);
    cp_async_commit();
  }

  using Acc = typename std::conditional<C::kInt8, int, float>::type;
  Acc acc[2][NT][4];
  zero_acc(acc);
  uint32_t af[C::kDepth][2][4];  // register-A formats' fragments in flight (WgCfg::kDepth)
  (void)af;

  for (int it = 0; it < nk; ++it) {
    wg_wait<C::kInFlight>();  // this warpgroup's reads of stage it − 2 are done
    cp_async_wait<D - 1>();  // this thread's copies of stage it have landed
    fence_proxy_async();
    __syncthreads();
    {
      const int nx = it + D;
      if (nx < nk) {
        load_w(nx % S, kt0 + nx);
        load_a(nx % S, kt0 + nx);
      }
      cp_async_commit();
    }
    if (wg_on) {
      const uint8_t* st = smem + (it % S) * C::kStageBytes;
      if constexpr (C::kSS) wg_mma_stage_ss<WF, SPLIT, BT>(acc, smem_u32(st), wg, nw);
      else wg_mma_stage_rs<WF, SPLIT, BT>(acc, af, st, wg, warp, lane, nw);
    }
  }
  wg_wait<0>();
  cp_async_wait<0>();
  // Rows of this warp's accumulators: register A (the mma.sync layout) 32·warp + 16·mt + ...;
  // shared-memory A (instruction mt covers tile rows 64·mt..) 64·mt + 16·warp + ...
  if (wg_on) {
    if constexpr (C::kSS) store_partials<NT, 64>(a, acc, e, split, n0 + warp * 16, lane, cnt, s_slot, s_arow);
    else store_partials<NT>(a, acc, e, split, n0 + warp * 32, lane, cnt, s_slot, s_arow);
  }
#else
  (void)a;
  __trap();
#endif
}

// Ties the accumulators to this point of the program (an empty asm that "writes" them), so that no
// use of them is scheduled above it — the wait for the last wgmma group. Without it the compiler
// hoisted the INT8 epilogue's int → float conversions above wgmma.wait_group, and ptxas then
// serialised every wgmma of the kernel (C7514).
template <class Acc, int N>
__device__ __forceinline__ void fence_acc(Acc (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<Acc, int>) asm volatile("" : "+r"(acc[i])::"memory");
    else asm volatile("" : "+f"(acc[i])::"memory");
  }
}

// ---- FP8 W8A8 on the e4m3 tensor cores (CudaOptions::fp8_mma, AFmt::E4m3) -------------------------
// A CTA is one 128-row FP8 weight tile (the fragment layout of the mma.sync kernel, cuda_common.h)
// and BT = 64 or 128 tokens, two warpgroups: warpgroup g takes m-fragment g of every warp's 32 rows
// (tile rows 32·warp + 16·g + 0..15), so each holds one m64 × BT accumulator. Per 128-K stage a
// warp reads its 4 fragment chunks (one 16-byte load per k32 step: the two words of k16 steps 2s
// and 2s + 1), builds the e4m3 A registers of wgmma m64nBTk32 with two byte permutes per register
// pair (the activation rows are stored in the matching order, e4m3_act_pos), and issues the 4 k32
// wgmmas into a stage accumulator (the first with scale-d = 0). Hopper's fp8 MMA adds products
// with ~13 fraction bits, so each stage's sum is waited for and added into the fp32 accumulator
// (DeepGEMM's promotion; the per-row / per-token scales come in the epilogue as for every format).
// Copies as gemm_wg_kernel (cp.async, S stages, prefetch distance S − 1: every stage's wgmmas are
// complete before the CTA barrier of the next).
template <int BT_, int NW_ = 1>
struct WgF8Cfg {
  using WT = WTraits<WFmt::FP8>;
  static constexpr int BT = BT_;
  static constexpr int NW = NW_;  // 128-row weight tiles per CTA (the warp-specialised form: 1 or 2)
  static_assert(BT == 64 || BT == 128, "e4m3 wgmma token tiles");
  static_assert(NW == 1 || NW == 2, "weight tiles per CTA");
  static constexpr bool kSS = false;
  static constexpr int kARaw = 128;  // activation bytes per row per stage: 128 e4m3 codes, one swizzle row
  static constexpr int kAtoms = 1;
  static constexpr int kATile = BT * 128;
  static constexpr int kW = kBW * WT::kStride;  // one 128-row weight tile of a stage (16 KB)
  static constexpr int kStageBytes = (kATile + NW * kW + 1023) / 1024 * 1024;
  static constexpr int kStagesFit = 220 * 1024 / kStageBytes;
  static constexpr int kStages = kStagesFit > 6 ? 6 : kStagesFit;
  static constexpr int kThreads = 256;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment of the base to 1024
  static_assert(kStages >= 3, "pipeline depth");
};

// D[64 × N] (+)= A[64 × 32] (e4m3, registers) · B[32 × N] (e4m3, shared memory), fp32 out;
// scale_d = 0: D = A·B.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_rs(float* d, const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  static_assert(N == 64 || N == 128, "e4m3 wgmma token tiles");
#if QMOE_WGMMA_DEVICE
  if constexpr (N == 64)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " QMOE_WG_DREGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : QMOE_WG_ACC32("+f", 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " QMOE_WG_DREGS64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : QMOE_WG_ACC64("+f", 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
#else
  (void)d, (void)a, (void)desc, (void)scale_d;
#endif
}

// One m64 fragment's 128-K stage: the warp's 4 fragment chunks at wf (one 16-byte load per k32
// step: the words of k16 steps 2s and 2s + 1; low / high halves are rows r0 / r0 + 8) become the
// e4m3 A registers by two byte permutes per register pair; the 4 k32 wgmmas against the stage's
// activation tile at abase go into the stage sum `part` (the first with scale-d = 0), which is
// waited for and added into the fp32 accumulator `acc` (the promotion). Always BT wide: narrowed
// (wg_fit_n) per wgmma or per stage, ptxas serialised the wgmmas of these kernels for want of
// registers (C7511) and spilled the two-tile form.
template <int BT>
__device__ __forceinline__ void f8_mma_stage(float (&acc)[BT / 8][4], float (&part)[BT / 2], const uint8_t* wf,
                                             uint32_t abase) {
  uint32_t af[4][4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint4 v = *reinterpret_cast<const uint4*>(wf + s * 512);
    af[s][0] = __byte_perm(v.x, v.y, 0x5410);
    af[s][1] = __byte_perm(v.x, v.y, 0x7632);
    af[s][2] = __byte_perm(v.z, v.w, 0x5410);
    af[s][3] = __byte_perm(v.z, v.w, 0x7632);
  }
  wg_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) wgmma_e4m3_rs<BT>(part, af[s], wg_act_desc<BT>(abase, s), s);
  wg_commit();
  wg_wait<0>();
  fence_acc(part);
#pragma unroll
  for (int j = 0; j < BT / 8; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[j][k] += part[j * 4 + k];
}

template <int BT_>
__global__ void __launch_bounds__(256, 1) gemm_wg_f8_kernel(const GemmArgs a) {
#if QMOE_WGMMA_DEVICE
  using C = WgF8Cfg<BT_>;
  constexpr int BT = C::BT, NT = BT / 8, S = C::kStages, D = S - 1;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  __shared__ int s_arow[BT];
  __shared__ int s_slot[BT];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  int tile, ty;
  wg_cta_tile(tile, ty);
  if (a.tiles_after_wait) pdl_wait();  // align ran in the kernel just before (gemm_kernel)
  if (tile >= __ldcg(a.num_tiles)) return;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid & 127) >> 5, lane = tid & 31;
  int e, cnt;
  wg_tile_tokens<BT, 256>(a, tile, tid, e, cnt, s_slot, s_arow);
  const int n0 = ty * kBW;
  const int split = blockIdx.z;
  const int kt0 = split * a.kt_per_split;
  const int kt1 = min(a.Kt, kt0 + a.kt_per_split);
  const int nk = kt1 - kt0;

  // The stage's weight tile (16 KB, as stored) by all 256 threads, 4 chunks each.
  const uint8_t* wsrc = a.w + e * a.w_expert_stride + static_cast<int64_t>(ty) * a.Kt * C::kW + tid * 16;
  auto load_w = [&](int buf, int kt) {
    uint8_t* st = smem + buf * C::kStageBytes + C::kATile + tid * 16;
    const uint8_t* src = wsrc + static_cast<int64_t>(kt) * C::kW;
#pragma unroll
    for (int i = 0; i < C::kW / (256 * 16); ++i) cp_async16(st + i * 4096, src + i * 4096);
  };
  auto load_a = [&](int buf, int kt) {
    wg_copy_acts<C, false, 256, 0>(a, smem + buf * C::kStageBytes, static_cast<int64_t>(kt) * C::kARaw, tid, s_arow);
  };

#pragma unroll
  for (int s = 0; s < D; ++s)
    if (s < nk) load_w(s, kt0 + s);
  cp_async_commit();
  pdl_wait();
  pdl_trigger();
  __syncthreads();  // s_slot / s_arow
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < nk) load_a(s, kt0 + s);
    cp_async_commit();
  }

  float acc[1][NT][4];
  zero_acc(acc);
  float part[NT * 4];  // one stage's sum

  for (int it = 0; it < nk; ++it) {
    cp_async_wait<D - 1>();  // this thread's copies of stage it have landed
    fence_proxy_async();
    __syncthreads();  // everyone's copies of stage it; everyone done with stage it − 1's buffer
    {
      const int nx = it + D;
      if (nx < nk) {
        load_w(nx % S, kt0 + nx);
        load_a(nx % S, kt0 + nx);
      }
      cp_async_commit();
    }
    const uint8_t* st = smem + (it % S) * C::kStageBytes;
    // Fragment chunks 4·wg … 4·wg + 3 of this warp's 4 KB block: m-fragment wg.
    f8_mma_stage<BT>(acc[0], part, st + C::kATile + warp * 4096 + wg * 4 * 512 + lane * 16, smem_u32(st));
  }
  cp_async_wait<0>();
  store_partials<NT>(a, acc, e, split, n0 + warp * 32 + wg * 16, lane, cnt, s_slot, s_arow);
#else
  (void)a;
  __trap();
#endif
}

// ---- warp-specialised form (128-token tiles, two consumer warpgroups) ------------------------------
// The same tile, stage layout and per-warpgroup compute as gemm_wg_kernel, reorganised so that no
// warp both copies and multiplies and no CTA-wide barrier sits in the main loop: warpgroup 0 is the
// producer, warpgroups 1 and 2 are consumers (wait on the stage's `full` barrier, decode and issue
// wgmma as gemm_wg_kernel does, and arrive on its `empty` barrier once the wgmma groups that read
// it are complete — after the current stage's groups are issued, when at most kInFlight + 1 groups,
// all of the current stage, remain; every consumer thread arrives). The producer refills a stage
// only after `empty` completes, so up to S stages are in flight (gemm_wg_kernel: S − 2). Per stage
// its thread 0 issues one bulk copy per weight tile and block-scale block (each stored contiguous,
// in the layout the kernel reads) and, with GemmArgs::a_tma, the activation tile as TMA boxes of
// the tile-ordered operand (128B-swizzled by the TMA unit), announcing their bytes on `full`;
// without a_tma the 128 producer threads gather the activation rows by cp.async as gemm_wg_kernel
// does. `full` completes with those bytes and the 128 threads' cp.async.mbarrier.arrive.noinc.
// The activation copies were the cost: with the operand in tile order and one TMA box per 128-byte
// column, mixtral-8x7b at T = 4096 runs 1.12–1.2x faster (bench/RESULTS.md 2026-12-05 night), where
// moving the weights alone from cp.async to bulk copies changed nothing. Registers move to the
// consumers with setmaxnreg (producer kWsProducerRegs, consumers kWsConsumerRegs: 128 · 56 + 256 ·
// 224 = 64512 of 65536).
constexpr int kWsProducerRegs = 56, kWsConsumerRegs = 224;

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(addr), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on `bar` when all of this thread's earlier cp.async have completed (counted as one of the
// barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on `bar` and add `bytes` to the transaction count its phase waits for (the bulk copies
// below complete them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// One bulk copy (TMA engine, no tensor map) of `bytes` (a multiple of 16, both addresses 16-byte
// aligned) from global to this CTA's shared memory, completing `bytes` of `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// Add `bytes` to the transaction count of `bar`'s current phase without arriving.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// One box of a 2-D tensor map (a __grid_constant__ kernel parameter) at coordinates (c0 bytes, c1
// rows) into this CTA's shared memory (1024-byte aligned for the 128B swizzle), completing the
// box's bytes of `bar`'s transaction count.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
// The producer's weight tiles of stage kt, by its thread 0: tiles wt0 … wt0 + ntw − 1 of expert e
// (kW bytes each, stored contiguous per tile and stage) to dst + cw · kW and their block scales (kS
// bytes each, none where kS = 0) to sdst + cw · kS, one bulk copy per block, announced on `bar`.
template <int kW, int kS>
__device__ __forceinline__ void ws_bulk_weights(const GemmArgs& a, int e, int wt0, int ntw, int kt, uint8_t* dst,
                                                uint8_t* sdst, uint64_t* bar) {
  static_assert(kW % 16 == 0 && kS % 16 == 0, "bulk copies of whole 16-byte blocks");
  mbar_arrive_expect_tx(bar, static_cast<uint32_t>(ntw * (kW + kS)));
  for (int cw = 0; cw < ntw; ++cw) {
    const int wtile = wt0 + cw;
    bulk_copy_g2s(dst + cw * kW, a.w + e * a.w_expert_stride + (static_cast<int64_t>(wtile) * a.Kt + kt) * kW, kW, bar);
    if constexpr (kS > 0)
      bulk_copy_g2s(sdst + cw * kS,
                    a.wscale + e * a.ws_expert_stride + static_cast<int64_t>(wtile) * kS + static_cast<int64_t>(kt) * a.Npad * (kS / kBW),
                    kS, bar);
  }
}
// The activation tile of stage kt of a ws kernel by TMA (GemmArgs::a_tma): thread 0 of the
// producer announces the bytes on `bar` and loads the kAtoms 128-byte columns of the BT rows from
// row `row0` of the tile-ordered operand (and of its lo part, SPLIT).
template <class C, bool SPLIT>
__device__ __forceinline__ void ws_tma_acts(const GemmArgs& a, uint8_t* adst, int kt, int row0, uint64_t* bar) {
  constexpr int kBox = 128 * C::BT;
  mbar_expect_tx(bar, static_cast<uint32_t>(C::kAtoms * kBox * (SPLIT ? 2 : 1)));
#pragma unroll
  for (int q = 0; q < C::kAtoms; ++q) {
    const int c0 = kt * C::kARaw + q * 128;
    tma_load_2d(adst + q * kBox, &a.tma_hi, c0, row0, bar);
    if constexpr (SPLIT) tma_load_2d(adst + C::kATile + q * kBox, &a.tma_lo, c0, row0, bar);
  }
}
// The producer's activation tile of stage kt into the stage buffer st: by TMA from the tile-ordered
// operand (thread 0) or gathered by the 128 producer threads (wtid) through cp.async.
template <class C, bool SPLIT>
__device__ __forceinline__ void ws_load_acts(const GemmArgs& a, uint8_t* st, int kt, int row0, int wtid, const int* s_arow,
                                             uint64_t* bar) {
  if (a.a_tma) {
    if (wtid == 0) ws_tma_acts<C, SPLIT>(a, st, kt, row0, bar);
  } else {
    wg_copy_acts<C, SPLIT, 128, 4>(a, st, static_cast<int64_t>(kt) * C::kARaw, wtid, s_arow);
  }
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The S-stage ring of the warp-specialised kernels: `full` completes when the producer
// warpgroup's 128 threads' activation copies of a stage (cp.async arrivals) and the stage's weight
// bytes (one bulk copy per tile, announced by the producer's thread 0: one more arrival) have
// landed, `empty` when the 256 consumer threads are done with it (thread 0 initialises them; a CTA
// barrier must follow).
template <int S>
__device__ __forceinline__ void ws_init_ring(uint64_t* full_bar, uint64_t* empty_bar, int tid) {
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full_bar[s], 129);   // the producer's threads (cp.async arrivals) + the weights' expect_tx
      mbar_init(&empty_bar[s], 256);  // the consumer threads
    }
  }
}
// The producer's loop over one work item's nk stages, ring stages g … g + nk − 1 (g counts the
// stages of the CTA's earlier items): per stage, once the consumers have released the buffer's
// last use, its weights and activations, and the arrival on `full`. The CTA's first item (g = 0)
// issues the weights of its first S stages before the wait for the activations' producer
// (launch.cuh); later items run after that wait.
template <int S, class LoadW, class LoadA>
__device__ __forceinline__ void ws_produce(int nk, int kt0, int g, uint64_t* full_bar, uint64_t* empty_bar,
                                           const LoadW& load_w, const LoadA& load_a) {
  const bool first = g == 0;
  if (first) {
    for (int s = 0; s < S && s < nk; ++s) load_w(s, kt0 + s);
    pdl_wait();
    pdl_trigger();
  }
  for (int it = 0; it < nk; ++it) {
    const int gi = g + it, s = gi % S;
    if (!first || it >= S) {
      if (gi >= S) mbar_wait(&empty_bar[s], ((gi / S) - 1) & 1);  // the consumers are done with its last use
      load_w(s, kt0 + it);
    }
    load_a(s, kt0 + it);
    cp_async_mbar_arrive(&full_bar[s]);
  }
}

// ---- work items of the warp-specialised kernels ---------------------------------------------------
// A work item is one CTA of the classic grid (token tiles, weight-tile groups, K splits): a token
// tile, a group ty of the CTA's weight tiles, a K split. Classic launch: one item per CTA. Persistent
// launch (GemmArgs::persist_z > 0, gridDim.x ≤ the SM count): each CTA claims the next item of the
// same rasterised order over the tiles align made from a work counter (GemmArgs::claim), as the
// hardware hands out CTAs, so the producer streams the next item's first stages while the
// consumers finish the current one's last stages and its epilogue — no pipeline fill and no CTA
// start per item. (A fixed round robin, CTA b taking items b, b + gridDim.x, …, left CTAs idle at
// the end where items differ in length: 0.78–0.92x on INT8 / FP8 at T = 1024–4096, H100.)
//
// The producer warpgroup resolves each item (expert, token count, first row, its tokens' slots and
// activation rows) into one of two buffers in shared memory and announces it on `ready` (its 128
// threads); the 256 consumer threads release the buffer on `done` after their epilogue. An item with
// e < 0 ends the consumers' loop.
struct WsItem {
  int e, cnt, row0, ty, split, kt0, nk;
};
template <int BT>
struct WsItems {
  int claimed;  // the producer's thread 0 → its other threads
  WsItem item[2];
  int slot[2][BT];
  int arow[2][BT];
  uint64_t ready[2], done[2];
};
struct WsSched {
  int X, Y, total, w, stride;
  int* claim;  // persistent: the work counter; null: items w, w + stride, …
};
// This CTA's items; false where it has none.
__device__ __forceinline__ bool ws_sched(const GemmArgs& a, WsSched& sc) {
  if (a.tiles_after_wait) pdl_wait();  // align ran in the kernel just before (gemm_kernel)
  const int nt = __ldcg(a.num_tiles);
  if (a.persist_z > 0) {
    sc.X = nt;
    sc.Y = a.persist_y;
    sc.total = nt * sc.Y * a.persist_z;
    sc.w = blockIdx.x;
    sc.stride = gridDim.x;
    sc.claim = a.claim;
    return sc.w < sc.total;
  }
  sc.claim = nullptr;
  sc.X = gridDim.x;
  sc.Y = gridDim.y;
  sc.total = sc.X * sc.Y * gridDim.z;
  sc.w = blockIdx.x + sc.X * (blockIdx.y + sc.Y * blockIdx.z);
  sc.stride = sc.total;
  int tile, ty;
  wg_raster(blockIdx.x + sc.X * blockIdx.y, sc.X, sc.Y, tile, ty);
  return tile < nt;
}
template <int BT>
__device__ __forceinline__ void ws_init_items(WsItems<BT>& q, int tid) {
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(&q.ready[b], 128);  // the producer threads
      mbar_init(&q.done[b], 256);   // the consumer threads
    }
  }
}
__device__ __forceinline__ void producer_bar_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }
// The producer's side: per item, body(item, its activation rows in shared memory, g).
template <int BT, class Body>
__device__ __forceinline__ void ws_produce_items(const GemmArgs& a, const WsSched& sc, WsItems<BT>& q, int wtid,
                                                 const Body& body) {
  int g = 0;
  for (int k = 0, w = sc.w;; ++k, w += sc.stride) {
    const int b = k & 1;
    if (k >= 2) mbar_wait(&q.done[b], ((k >> 1) - 1) & 1);  // the consumers are done with item k − 2
    if (sc.claim != nullptr) {
      if (wtid == 0) q.claimed = atomicAdd(sc.claim, 1);
      producer_bar_sync();
      w = q.claimed;  // (read before the barrier below, after which thread 0 may claim again)
    }
    WsItem it{-1, 0, 0, 0, 0, 0, 0};
    const bool end = w >= sc.total;
    if (!end) {
      const int xy = sc.X * sc.Y;
      int tile;
      it.split = w / xy;
      wg_raster(w - it.split * xy, sc.X, sc.Y, tile, it.ty);
      it.row0 = wg_tile_tokens<BT, 128>(a, tile, wtid, it.e, it.cnt, q.slot[b], q.arow[b]);
      it.kt0 = it.split * a.kt_per_split;
      it.nk = min(a.Kt, it.kt0 + a.kt_per_split) - it.kt0;
    }
    if (wtid == 0) q.item[b] = it;
    producer_bar_sync();  // every producer thread gathers rows of the whole tile
    mbar_arrive(&q.ready[b]);
    if (end) break;
    body(it, q.arow[b], g);
    g += max(it.nk, 0);
  }
}
// The consumers' side: per item, body(item, its slots, its activation rows, g).
template <int BT, class Body>
__device__ __forceinline__ void ws_consume_items(WsItems<BT>& q, const Body& body) {
  int g = 0;
  for (int k = 0;; ++k) {
    const int b = k & 1;
    mbar_wait(&q.ready[b], (k >> 1) & 1);
    const WsItem& it = q.item[b];  // read where used: fewer live registers in the main loop
    if (it.e < 0) break;
    const int nk = it.nk;
    body(it, q.slot[b], q.arow[b], g);
    g += max(nk, 0);
    mbar_arrive(&q.done[b]);
  }
}


// Where it can run: 128-token tiles with two weight tiles per CTA, every format (ws_built); where it
// does by default: bf16 weights against fp32-accurate activations (kSS, both operands from shared
// memory, SPLIT: a bf16 hi and lo MMA per step) — ws_default. Measured on the H200
// (bench/RESULTS.md 2026-12-03, interleaved A/B against gemm_wg_kernel, T = 1024 / 4096, mixtral /
// qwen3 / deepseek / gpt-oss): that case 1.04–1.13x faster (tensor pipe 62 -> 72–78 % on mixtral
// T = 4096); bf16 activations (one MMA per step) 0.96–1.0x, register-decoded formats (MXFP4 /
// NVFP4 0.90–0.94x, FP8 0.96–1.0x) and INT8 (0.98–1.0x) stay on gemm_wg_kernel unless their
// activation tiles come by TMA (GemmArgs::a_tma: then every format it is built for runs here, the
// faster choice, bench/RESULTS.md 2026-12-05 night) or QMOE_CUDA_WS=all (gemm.cuh ws_mode) asks.
// Persistent (GemmArgs::persist > 0, the default) it is the faster kernel for every format but INT8,
// with or without TMA: the next item's stages load while the last one's epilogue runs (H100, qwen3-30b-a3b
// T = 1024: 1.05-1.06x on the 4-bit and bf16 schemes, INT8 0.97-1.02x; bench/RESULTS.md 2026-12-06,
// session 41).
template <WFmt WF, bool SPLIT, int BT>
constexpr bool ws_built() {
  using C = WgCfg<WF, SPLIT, BT>;
  return C::kSupported && C::kWG == 2 && (BT == 64 || BT == 128);
}
template <WFmt WF, bool SPLIT, int BT>
constexpr bool ws_default(bool persistent) {
  using C = WgCfg<WF, SPLIT, BT>;
  return ws_built<WF, SPLIT, BT>() && !C::kInt8 && (persistent || (C::kSS && SPLIT && BT == 128));
}

template <WFmt WF, bool SPLIT, int BT_>
__global__ void __launch_bounds__(384, 1) gemm_ws_kernel(const __grid_constant__ GemmArgs a) {
#if QMOE_WGMMA_DEVICE
  using C = WgCfg<WF, SPLIT, BT_>;
  using WT = typename C::WT;
  using F = AFrag<WF>;
  static_assert(ws_built<WF, SPLIT, BT_>(), "two consumer warpgroups, 64- or 128-token tiles");
  constexpr int BT = C::BT, NT = BT / 8, S = C::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  __shared__ WsItems<BT> q;
  __shared__ uint64_t full_bar[S], empty_bar[S];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  WsSched sc;
  if (!ws_sched(a, sc)) return;
  const int tid = threadIdx.x, wgi = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  ws_init_ring<S>(full_bar, empty_bar, tid);
  ws_init_items(q, tid);
  __syncthreads();  // barriers initialised

  if (wgi == 0) {
    // ---- producer ----
    setmaxnreg_dec<kWsProducerRegs>();
    // The stage's weight tiles (and block scales) as stored — one contiguous block each — by bulk
    // copies that thread 0 issues and announces on `full` (ws_bulk_weights: one instruction per
    // block where 128 threads issued 16-byte cp.async; the activation gather keeps those).
    static_assert(C::kW1 == kBW * WT::kRaw && C::kS1 == kBW * WT::kScale, "weight and scale blocks as stored");
    ws_produce_items<BT>(a, sc, q, wtid, [&](const WsItem& it, const int* s_arow, int g) {
      const int ntw = min(C::kWG, a.Npad / kBW - it.ty * C::kWG);  // weight tiles of this item (1 or 2)
      auto load_w = [&](int buf, int kt) {
        if (wtid != 0) return;
        uint8_t* st = smem + buf * C::kStageBytes + C::kAStage;
        ws_bulk_weights<C::kW1, C::kS1>(a, it.e, it.ty * C::kWG, ntw, kt, st, st + C::kWG * C::kW1, &full_bar[buf]);
      };
      auto load_a = [&](int buf, int kt) {
        ws_load_acts<C, SPLIT>(a, smem + buf * C::kStageBytes, kt, it.row0, wtid, s_arow, &full_bar[buf]);
      };
      ws_produce<S>(it.nk, it.kt0, g, full_bar, empty_bar, load_w, load_a);
    });
    cp_async_wait<0>();
  } else {
    // ---- consumers ----
    setmaxnreg_inc<kWsConsumerRegs>();
    pdl_wait();
    pdl_trigger();
    const int cw = wgi - 1;
    using Acc = typename std::conditional<C::kInt8, int, float>::type;
    static_assert(C::kSS || C::kInFlight < F::kSteps, "a stage's issued groups leave no earlier stage's in flight");
    auto release = [&](int gi) { mbar_arrive(&empty_bar[gi % S]); };
    ws_consume_items<BT>(q, [&](const WsItem& it, const int* s_slot, const int* s_arow, int g) {
      const int wtile = it.ty * C::kWG + cw;
      const bool wg_on = wtile < a.Npad / kBW;
      const int nw = wg_fit_n<BT>(a, it.cnt);
      const int nk = it.nk;
      Acc acc[2][NT][4];
      zero_acc(acc);
      uint32_t af[C::kDepth][2][4];
      (void)af;
      if (!wg_on) {  // no weight tile for this warpgroup (odd tile count): release every stage
        for (int i = 0; i < nk; ++i) {
          mbar_wait(&full_bar[(g + i) % S], ((g + i) / S) & 1);
          release(g + i);
        }
      }
      for (int i = 0; i < (wg_on ? nk : 0); ++i) {
        const int gi = g + i, s = gi % S;
        if constexpr (C::kSS) {  // one group per stage: the one before the previous stage's is done
          wg_wait<1>();
          if (i > 1) release(gi - 2);
        }
        mbar_wait(&full_bar[s], (gi / S) & 1);
        fence_proxy_async();  // the cp.async writes, made visible by the barrier, before wgmma's reads
        const uint8_t* st = smem + s * C::kStageBytes;
        if constexpr (C::kSS) {
          wg_mma_stage_ss<WF, SPLIT, BT>(acc, smem_u32(st), cw, nw);
        } else {
          wg_wait<C::kInFlight>();  // the group that last read af[0] is done
          wg_mma_stage_rs<WF, SPLIT, BT>(acc, af, st, cw, warp, lane, nw);
          // At most kInFlight + 1 groups are left, all of this stage: the previous one is free.
          if (i > 0) release(gi - 1);
        }
      }
      wg_wait<0>();
      fence_acc(reinterpret_cast<Acc(&)[2 * NT * 4]>(acc));
      if (wg_on) {
        // The stages the loop left held (the last two, one group per stage; else the last one).
        for (int i = max(0, nk - (C::kSS ? 2 : 1)); i < nk; ++i) release(g + i);
        const int n0 = wtile * kBW;
        if constexpr (C::kSS) store_partials<NT, 64>(a, acc, it.e, it.split, n0 + warp * 16, lane, it.cnt, s_slot, s_arow);
        else store_partials<NT>(a, acc, it.e, it.split, n0 + warp * 32, lane, it.cnt, s_slot, s_arow);
      }
    });
  }
#else
  (void)a;
  __trap();
#endif
}

// The e4m3 kernel in the warp-specialised form of gemm_ws_kernel: warpgroup 0 copies (bulk copies,
// TMA or cp.async into the S-stage ring, as there), warpgroups 1 and 2 multiply with no CTA barrier, so
// one warpgroup's waits and promotions overlap the other's MMAs. NW = 1: the CTA is one 128-row
// weight tile and consumer c takes its m-fragment c (as gemm_wg_f8_kernel); NW = 2: the CTA is two
// weight tiles against one activation tile (a third less copied per MMA) and consumer c takes all
// of tile c, one m-fragment after the other (its stage sum is one m64 accumulator: the registers
// hold two fp32 accumulators and one stage sum).
template <int BT_, int NW>
__global__ void __launch_bounds__(384, 1) gemm_ws_f8_kernel(const __grid_constant__ GemmArgs a) {
#if QMOE_WGMMA_DEVICE
  using C = WgF8Cfg<BT_, NW>;
  constexpr int BT = C::BT, NT = BT / 8, S = C::kStages;
  constexpr int MF = NW;  // m-fragments per consumer warpgroup
  extern __shared__ __align__(128) uint8_t smem_raw[];
  __shared__ WsItems<BT> q;
  __shared__ uint64_t full_bar[S], empty_bar[S];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);

  WsSched sc;
  if (!ws_sched(a, sc)) return;
  const int tid = threadIdx.x, wgi = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  ws_init_ring<S>(full_bar, empty_bar, tid);
  ws_init_items(q, tid);
  const int ntiles = a.Npad / kBW;
  __syncthreads();  // barriers initialised

  if (wgi == 0) {
    // ---- producer ----
    setmaxnreg_dec<kWsProducerRegs>();
    // The stage's weight tiles by bulk copies from thread 0 (ws_bulk_weights, as gemm_ws_kernel).
    ws_produce_items<BT>(a, sc, q, wtid, [&](const WsItem& it, const int* s_arow, int g) {
      const int ntw = min(NW, ntiles - it.ty * NW);
      auto load_w = [&](int buf, int kt) {
        if (wtid == 0)
          ws_bulk_weights<C::kW, 0>(a, it.e, it.ty * NW, ntw, kt, smem + buf * C::kStageBytes + C::kATile, nullptr,
                                    &full_bar[buf]);
      };
      auto load_a = [&](int buf, int kt) {
        ws_load_acts<C, false>(a, smem + buf * C::kStageBytes, kt, it.row0, wtid, s_arow, &full_bar[buf]);
      };
      ws_produce<S>(it.nk, it.kt0, g, full_bar, empty_bar, load_w, load_a);
    });
    cp_async_wait<0>();
  } else {
    // ---- consumers ----
    setmaxnreg_inc<kWsConsumerRegs>();
    pdl_wait();
    pdl_trigger();
    const int cw = wgi - 1;
    ws_consume_items<BT>(q, [&](const WsItem& it, const int* s_slot, const int* s_arow, int g) {
      // NW = 1: tile ty, m-fragment cw; NW = 2: tile 2·ty + cw, m-fragments 0 and 1.
      const int wtile = NW == 1 ? it.ty : it.ty * NW + cw;
      const bool on = wtile < ntiles;
      float acc[MF][NT][4];
      zero_acc(acc);
      float part[NT * 4];
      for (int i = 0; i < it.nk; ++i) {
        const int gi = g + i, s = gi % S;
        mbar_wait(&full_bar[s], (gi / S) & 1);
        fence_proxy_async();  // the cp.async writes, made visible by the barrier, before wgmma's reads
        const uint8_t* st = smem + s * C::kStageBytes;
        const uint32_t abase = smem_u32(st);
#pragma unroll
        for (int m = 0; m < MF; ++m) {
          if (!on) break;
          const int mt = NW == 1 ? cw : m;
          f8_mma_stage<BT>(acc[m], part,
                           st + C::kATile + (NW == 1 ? 0 : cw) * C::kW + warp * 4096 + mt * 4 * 512 + lane * 16, abase);
        }
        mbar_arrive(&empty_bar[s]);
      }
      if (on) {
        if constexpr (NW == 1)
          store_partials<NT>(a, acc, it.e, it.split, it.ty * kBW + warp * 32 + cw * 16, lane, it.cnt, s_slot, s_arow);
        else store_partials<NT>(a, acc, it.e, it.split, wtile * kBW + warp * 32, lane, it.cnt, s_slot, s_arow);
      }
    });
  }
#else
  (void)a;
  __trap();
#endif
}

// A warp-specialised kernel over the classic grid (token tiles, weight-tile groups, K splits): one
// CTA per item, or with GemmArgs::persist (and its work counter, claim) at most that many CTAs, each
// claiming the grid's items one after another (ws_sched).
template <auto kKernel, int kSmem>
void launch_ws(const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (a.persist <= 0 || a.claim == nullptr) {
    launch_pdl_smem<kKernel, kSmem>(grid, 384, s, a);
    return;
  }
  GemmArgs p = a;
  p.persist_y = static_cast<int>(grid.y);
  p.persist_z = static_cast<int>(grid.z);
  const int64_t items = int64_t{grid.x} * grid.y * grid.z;
  launch_pdl_smem<kKernel, kSmem>(dim3(static_cast<unsigned>(std::min<int64_t>(items, a.persist))), 384, s, p);
}

// ws: 0 = gemm_wg_f8_kernel, 1 / 2 = gemm_ws_f8_kernel with that many weight tiles per CTA.
template <int BT>
void launch_gemm_f8(const GemmArgs& a, dim3 grid, cudaStream_t s, int ws) {
  if (ws == 0) {
    launch_pdl_smem<gemm_wg_f8_kernel<BT>, WgF8Cfg<BT>::kSmem>(grid, 256, s, a);
  } else if (ws == 1) {
    launch_ws<gemm_ws_f8_kernel<BT, 1>, WgF8Cfg<BT, 1>::kSmem>(a, grid, s);
  } else {
    grid.y = (grid.y + 1) / 2;
    launch_ws<gemm_ws_f8_kernel<BT, 2>, WgF8Cfg<BT, 2>::kSmem>(a, grid, s);
  }
}

template <WFmt WF, bool SPLIT, int BT>
void launch_gemm_ws(const GemmArgs& a, dim3 grid, cudaStream_t s) {
  using C = WgCfg<WF, SPLIT, BT>;
  grid.y = (grid.y + C::kWG - 1) / C::kWG;
  launch_ws<gemm_ws_kernel<WF, SPLIT, BT>, C::kSmem>(a, grid, s);
}

// grid: (tiles, Npad / 128, splits) as for gemm_kernel; the kernel takes kWG weight tiles per CTA.
template <WFmt WF, bool SPLIT, int BT>
void launch_gemm_wg(const GemmArgs& a, dim3 grid, cudaStream_t s) {
  using C = WgCfg<WF, SPLIT, BT>;
  grid.y = (grid.y + C::kWG - 1) / C::kWG;
  launch_pdl_smem<gemm_wg_kernel<WF, SPLIT, BT>, C::kSmem>(grid, C::kThreads, s, a);
}

}  // namespace qmoe::cuda
