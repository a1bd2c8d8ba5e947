// The grouped expert GEMM (GEMM1 and GEMM2 alike), mma.sync on sm_80+ / sm_90.
//
// Roles are swapped as in Marlin / triton_kernels: the weight rows are the MMA's M side (16-row
// fragments, 128 rows per CTA, 32 per warp) and the routed tokens the N side (8-token fragments,
// BT tokens per CTA), so a decode step with a few tokens per expert wastes little of the MMA.
//
// Per stage (64 K for bf16, 128 K otherwise) a CTA copies (cp.async, 16-byte, STAGES deep) the
// weight tile (tile-major in global memory: one contiguous block), its block scales and the BT
// activation rows. Then, by format:
//  * BF16, INT8: ldmatrix straight from the staged tile;
//  * FP8, MXFP4, NVFP4, MXFP6: the codes are stored in MMA-fragment order (repacked at upload)
//    and decoded straight into the A fragments in registers: FP8 by cvt.rn.f16x2.e4m3x2, the
//    FP4 / FP6 formats by shifts and masks into bf16 bits and one bf16x2 multiply by the block
//    scale (frag_layout.h; exact).
// Tiles of 8 tokens (one n8 fragment) serve decode, 16 / 32 / 64 / 128 larger batches (32 and up on
// the wgmma kernel where the device has it, gemm_wgmma.cuh); the
// 16-token groups of a tile past its expert's token count are neither copied nor multiplied.
// The 4 warps run mma.m16n8k16 bf16 / f16 (fp32 accumulate) or, for INT8, mma.m16n8k32 s8 (exact
// int32 accumulate). Bf16Split feeds the activation as hi + lo (2 MMAs).
// The epilogue multiplies by the per-expert, per-channel and per-row scales in fp32 and writes the
// K-split partial for each (slot, weight row); consumers sum the partials in split order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/cuda_common.h"
#include "cuda/decode.cuh"
#include "cuda/frag_layout.h"
#include "cuda/launch.cuh"
#include "qmoe/error.h"

namespace qmoe::cuda {

// ---- PTX wrappers --------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// B operand of 16 tokens (x4: r[0..1] tokens 0–7, r[2..3] tokens 8–15) or, for an 8-token tile,
// of 8 (x2: r[0..1]; the addresses of lanes 0–15 are read).
template <int BT>
__device__ __forceinline__ void ldsm_b(uint32_t (&r)[4], const void* p) {
  if constexpr (BT >= 16) {
    ldsm_x4(r, p);
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
    r[2] = r[3] = 0;
  }
}
// This lane's N fragment words of a staged block laid out [q][lane 32][4 words] (16 bytes per
// lane per q: conflict-free 16-byte shared loads).
template <int N>
__device__ __forceinline__ void load_frag_words(uint32_t (&w)[N], const uint8_t* block, int lane) {
  static_assert(N % 4 == 0, "whole 16-byte chunks");
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const uint4 v = *reinterpret_cast<const uint4*>(block + (q * 32 + lane) * 16);
    w[4 * q] = v.x;
    w[4 * q + 1] = v.y;
    w[4 * q + 2] = v.z;
    w[4 * q + 3] = v.w;
  }
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 16-bit float MMA: fp16 for FP8 weights (e4m3 → f16 by hardware, activations fp8 codes as f16),
// bf16 for everything else.
template <bool kF16>
__device__ __forceinline__ void mma_16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16) mma_f16(c, a, b0, b1);
  else mma_bf16(c, a, b0, b1);
}
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- per-format tile geometry ----------------------------------------------------------------
template <WFmt WF>
struct WTraits;
// kBK: K elements per stage; kRaw: bytes per row per stage; kStride: its shared-memory row stride
// (padded: conflict-free ldmatrix / 16-byte decode reads); kScale: block-scale bytes per row per
// stage.
// kRegDecode (FP8, FP4, FP6): the stage is stored in MMA-fragment order (cuda_common.h) and
// decoded straight into the A fragments in registers (AFrag), with no 16-bit tile in shared memory.
template <> struct WTraits<WFmt::BF16> { static constexpr int kBK = 64, kRaw = 128, kStride = 144, kScale = 0; static constexpr bool kRegDecode = false; };
template <> struct WTraits<WFmt::INT8> { static constexpr int kBK = 128, kRaw = 128, kStride = 144, kScale = 0; static constexpr bool kRegDecode = false; };
template <> struct WTraits<WFmt::FP8> { static constexpr int kBK = 128, kRaw = 128, kStride = 128, kScale = 0; static constexpr bool kRegDecode = true; };
template <> struct WTraits<WFmt::MXFP4> { static constexpr int kBK = 128, kRaw = 64, kStride = 64, kScale = 4; static constexpr bool kRegDecode = true; };
template <> struct WTraits<WFmt::MXFP6_E2M3> { static constexpr int kBK = 128, kRaw = 96, kStride = 96, kScale = 4; static constexpr bool kRegDecode = true; };
template <> struct WTraits<WFmt::MXFP6_E3M2> { static constexpr int kBK = 128, kRaw = 96, kStride = 96, kScale = 4; static constexpr bool kRegDecode = true; };
template <> struct WTraits<WFmt::NVFP4> { static constexpr int kBK = 128, kRaw = 64, kStride = 64, kScale = 8; static constexpr bool kRegDecode = true; };

// ---- the A operand (weights) of one warp for one stage -------------------------------------------
// A warp owns 32 weight rows of a 128-row tile: m-fragment mt (0, 1) = rows 32·warp + 16·mt + 0..15.
// load() reads what the stage holds for them (fragment words and block scales for the
// register-decode formats; nothing for the ldmatrix formats), get(kk) yields the two m16 × k
// fragments of MMA k step kk (k16 for 16-bit MMAs, k32 for INT8) in the mma.sync / wgmma A
// register layout. Shared by the mma.sync and the wgmma kernels: one decode.
template <WFmt WF>
struct AFrag {
  using WT = WTraits<WF>;
  static constexpr bool kInt8 = WF == WFmt::INT8;
  static constexpr bool kFp8 = WF == WFmt::FP8;
  static constexpr bool kFp6 = WF == WFmt::MXFP6_E2M3 || WF == WFmt::MXFP6_E3M2;
  static constexpr bool kNv = WF == WFmt::NVFP4;
  static constexpr bool kF16 = kFp8;  // FP8 weights run fp16 MMAs (e4m3 → f16 exact)
  static constexpr int kSteps = kInt8 ? WT::kBK / 32 : WT::kBK / 16;  // MMA k steps per stage
  static constexpr int kSW = WT::kScale > 0 ? WT::kScale / 4 : 1;      // scale words per row
  static constexpr int kWords = kFp8 ? 32 : WT::kRegDecode ? 16 : 1;
  uint32_t wv[kWords];
  uint32_t w2[kFp6 ? 8 : 1];
  uint32_t sw[2][2][kSW];
  const uint8_t* tile = nullptr;

  // wst: the stage's 128-row weight tile; sst: its block scales.
  __device__ __forceinline__ void load(const uint8_t* wst, const uint8_t* sst, int warp, int lane) {
    if constexpr (kFp8) {
      // 32 fragment words (2 m-fragments × 8 k16 steps × 2); word 2·(mt·8 + kk) + p holds
      // registers a(2p), a(2p+1) as e4m3 pairs (cuda_common.h).
      load_frag_words(wv, wst + warp * 4096, lane);
    } else if constexpr (WT::kRegDecode) {
      // 16 fragment words (2 m-fragments × 8 k16 steps); FP6: and its 8 plane-2 words (one per
      // k16 step) after the 8 KB plane-4 block.
      load_frag_words(wv, wst + warp * 2048, lane);
      if constexpr (kFp6) load_frag_words(w2, wst + 8192 + warp * 1024, lane);
      // Block-scale words of the thread's 4 rows (r0 = warp·32 + mt·16 + lane/4, r1 = r0 + 8), in
      // the kernel form of frag_layout.h.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int i = 0; i < kSW; ++i)
            sw[mt][hh][i] = reinterpret_cast<const uint32_t*>(sst + (warp * 32 + mt * 16 + (lane >> 2) + hh * 8) * WT::kScale)[i];
    } else {
      // ldmatrix rows of the thread: rows (lane & 15) of the m16 fragment, k half lane / 16.
      tile = wst + (warp * 32 + (lane & 7) + ((lane >> 3) & 1) * 8) * WT::kStride + (lane >> 4) * 16;
    }
  }

  __device__ __forceinline__ void get(int kk, uint32_t (&af)[2][4]) const {
    if constexpr (kFp8) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int f = 2 * (mt * 8 + kk);
        e4m3x4_to_f16x2x2(wv[f], af[mt][0], af[mt][1]);
        e4m3x4_to_f16x2x2(wv[f + 1], af[mt][2], af[mt][3]);
      }
    } else if constexpr (WT::kRegDecode) {
      const int blk = kNv ? kk : kk / 2;  // 16- / 32-element scale block
      const int pair = blk % 2, half = (blk % 4) / 2;  // its multiplier: fp4_scale_pair_bf16x2
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t m0 = fp4_scale_pair_bf16x2<kNv>(sw[mt][0][blk / 4], pair);
        const uint32_t m1 = fp4_scale_pair_bf16x2<kNv>(sw[mt][1][blk / 4], pair);
        uint32_t o[4];
        if constexpr (kFp6) fp6_frag_decode<WF == WFmt::MXFP6_E3M2>(wv[mt * 8 + kk], w2[kk], mt, o);
        else fp4_frag_decode(wv[mt * 8 + kk], o);  // value · 2^−126 (E3M2: 2^−124), exact
        af[mt][0] = bf16x2_mul_half_bits(o[0], m0, half);
        af[mt][1] = bf16x2_mul_half_bits(o[1], m1, half);
        af[mt][2] = bf16x2_mul_half_bits(o[2], m0, half);
        af[mt][3] = bf16x2_mul_half_bits(o[3], m1, half);
      }
    } else {  // BF16 (k16 · 2 bytes) and INT8 (k32 · 1 byte): 32 bytes per k step
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) ldsm_x4(af[mt], tile + mt * 16 * WT::kStride + kk * 32);
    }
  }
};

// One mma.sync of the format: m16n8k16 bf16 / f16 (fp32 accumulate) or m16n8k32 s8 (int32).
template <WFmt WF, class Acc>
__device__ __forceinline__ void mma_frag(Acc (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (WF == WFmt::INT8) mma_s8(c, a, b0, b1);
  else mma_16<AFrag<WF>::kF16>(c, a, b0, b1);
}

// The accumulators of a GEMM kernel, [m-fragment][token fragment][4], set to zero.
template <class Acc, int M, int NT>
__device__ __forceinline__ void zero_acc(Acc (&acc)[M][NT][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0;
}

// ---- epilogue ------------------------------------------------------------------------------------
// Scales in fp32 and one partial per (split, slot, row): the warp's rows nw + kMStride·mt + lane/4
// (+ 8) for its M m-fragments, its tokens j = 8·nt + 2·(lane % 4) + q (the mma.sync C and the
// wgmma D layouts alike).
template <int NT, int kMStride = 16, class Acc, int M>
__device__ __forceinline__ void store_partials(const GemmArgs& a, const Acc (&acc)[M][NT][4], int e, int split, int nw,
                                               int lane, int cnt, const int* s_slot, const int* s_arow) {
  const float es = a.escale[e];
  const float* cs = a.colscale ? a.colscale + static_cast<int64_t>(e) * a.Npad : nullptr;
  float* out = a.out + static_cast<int64_t>(split) * a.TK * a.N;
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = nw + mt * kMStride + (lane >> 2) + h * 8;
      if (n >= a.N) continue;
      const float f = cs ? es * cs[n] : es;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int j = nt * 8 + (lane & 3) * 2 + q;
          if (j >= cnt) continue;
          float v = static_cast<float>(acc[mt][nt][h * 2 + q]) * f;
          if (a.a_rowscale) v *= a.a_rowscale[s_arow[j]];
          out[static_cast<int64_t>(s_slot[j]) * a.N + n] = v;
        }
      }
    }
  }
}

template <WFmt WF, int BT, bool SPLIT>
struct GemmCfg {
  using WT = WTraits<WF>;
  static constexpr bool kInt8 = WF == WFmt::INT8;
  static constexpr int kBK = WT::kBK;
  static constexpr int kARaw = kInt8 ? kBK : 2 * kBK;  // global bytes per activation row per stage
  static constexpr int kAStride = kARaw + 16;          // smem bytes per activation row
  static constexpr int kANum = SPLIT ? 2 : 1;
  static constexpr int kWStage = kBW * WT::kStride;
  static constexpr int kSStage = kBW * WT::kScale;
  static constexpr int kAStage = BT * kAStride * kANum;
  static constexpr int kStageBytes = kWStage + kSStage + kAStage;
  // FP4 register-decode stages are small: spend less shared memory so that 4–5 CTAs share an
  // SM; FP8 (16 KB of weights per stage) takes 4 stages, 2 CTAs per SM.
  static constexpr bool kFp6 = WF == WFmt::MXFP6_E2M3 || WF == WFmt::MXFP6_E3M2;
  static constexpr int kBudget = WF == WFmt::FP8 ? 96 * 1024 : kFp6 ? 64 * 1024 : WT::kRegDecode ? 48 * 1024 : 110 * 1024;
  static constexpr int kStagesFit = kBudget / kStageBytes;
  static constexpr int kStages = kStagesFit < 2 ? 2 : (kStagesFit > 8 ? 8 : kStagesFit);
  static constexpr int kSmem = kStages * kStageBytes;
  static_assert(BT == 8 || BT % 16 == 0, "token tile must be 8 or a multiple of 16");
  static_assert(kWStage % 16 == 0 && kSStage % 16 == 0 && kAStage % 16 == 0, "16-byte aligned stages");
};

template <WFmt WF, int BT, bool SPLIT>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(const GemmArgs a) {
  using C = GemmCfg<WF, BT, SPLIT>;
  using WT = typename C::WT;
  using F = AFrag<WF>;
  constexpr int NT = BT / 8;  // 8-token MMA fragments
  constexpr int NP = BT >= 16 ? BT / 16 : 1;  // B-operand loads per k step
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_arow[BT];
  __shared__ int s_slot[BT];

  const int tile = blockIdx.x;
  // align's outputs are complete when this grid starts (launch.cuh), so the tile and the weight
  // prologue come before pdl_wait (L2 reads: nothing of this grid cached them) — unless align ran
  // in the kernel just before (launch_prep).
  if (a.tiles_after_wait) pdl_wait();
  if (tile >= __ldcg(a.num_tiles)) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int e = __ldcg(a.tile_expert + tile), m0 = __ldcg(a.tile_m0 + tile);
  const int cnt = min(BT, __ldcg(a.counts + e) - m0);
  const int base = __ldcg(a.offsets + e) + m0;
  for (int i = tid; i < BT; i += kGemmThreads) {
    const int slot = i < cnt ? __ldcg(a.sorted_slots + base + i) : -1;
    s_slot[i] = slot;
    s_arow[i] = slot < 0 ? -1 : slot / a.a_row_div;
  }
  const int n0 = blockIdx.y * kBW;
  const int split = blockIdx.z;
  const int kt0 = split * a.kt_per_split;
  const int kt1 = min(a.Kt, kt0 + a.kt_per_split);
  const int nk = kt1 - kt0;
  // Tile-major weights: the 128 rows × 64 K of one stage are one contiguous block.
  const uint8_t* wbase = a.w + e * a.w_expert_stride + static_cast<int64_t>(blockIdx.y) * a.Kt * (kBW * WT::kRaw);
  const uint8_t* sbase = nullptr;
  if constexpr (WT::kScale > 0) sbase = a.wscale + e * a.ws_expert_stride + static_cast<int64_t>(n0) * WT::kScale;
  const uint8_t* abase_hi = static_cast<const uint8_t*>(a.a_hi);
  const uint8_t* abase_lo = static_cast<const uint8_t*>(a.a_lo);

  // Copy plan of one stage, with compile-time trip counts so that the copies unroll into bare
  // cp.async with constant offsets (a run-time loop here cost more issue slots than the MMAs).
  // Weights: kWPer 16-byte chunks per thread (kBW = 128 rows = one row per thread per chunk row).
  constexpr int kWChunksRow = WT::kRaw / 16;
  constexpr int kWPer = kBW * kWChunksRow / kGemmThreads;
  static_assert(kBW * kWChunksRow % kGemmThreads == 0, "weight chunks per thread");
  // Activations: BT rows of kARaw bytes; chunk c = tid + i·128 is row c / kAChunksRow.
  constexpr int kAChunksRow = C::kARaw / 16;
  constexpr int kAChunks = BT * kAChunksRow;
  constexpr int kAPer = (kAChunks + kGemmThreads - 1) / kGemmThreads;
  const uint8_t* wsrc = wbase + tid * 16;
  const int64_t s_stride = static_cast<int64_t>(a.Npad) * WT::kScale;  // scale bytes per stage
  // Stored chunk q of row r goes to chunk q of the shared row, or, BF16 / INT8 (stored 128B-swizzled,
  // cuda_common.h), to chunk sw128_chunk(r, q) — the chunk it holds.
  auto w_dst_rq = [](int r, int q) { return r * WT::kStride + (WT::kRegDecode ? q : sw128_chunk(r, q)) * 16; };
  // This thread's weight chunk i lands at w_dst0 + i · (rows per chunk round) · kStride when the
  // chunks of a row divide the CTA (all but FP6): one register and immediate offsets (the rounds
  // are 16 rows apart, a multiple of the swizzle's 8).
  static_assert(kGemmThreads % kWChunksRow != 0 || (kGemmThreads / kWChunksRow) % 8 == 0, "swizzle period");
  const int w_dst0 = w_dst_rq(tid / kWChunksRow, tid % kWChunksRow);
  auto w_dst = [&](int i) {
    if constexpr (kGemmThreads % kWChunksRow == 0) {
      return w_dst0 + i * (kGemmThreads / kWChunksRow) * WT::kStride;
    } else {
      const int c = tid + i * kGemmThreads;
      return w_dst_rq(c / kWChunksRow, c % kWChunksRow);
    }
  };
  // Weights and block scales of one stage (sources wk, sk) into the stage buffer at byte offset off.
  auto copy_w = [&](uint32_t off, const uint8_t* wk, const uint8_t* sk) {
    uint8_t* st = smem + off;
#pragma unroll
    for (int i = 0; i < kWPer; ++i) cp_async16(st + w_dst(i), wk + i * kGemmThreads * 16);
    if constexpr (WT::kScale > 0) {
      static_assert(C::kSStage / 16 <= kGemmThreads, "scale chunks per stage");
      if (tid < C::kSStage / 16) cp_async16(st + C::kWStage + tid * 16, sk + tid * 16);
    }
  };
  // Sources of stage kt.
  auto w_src = [&](int kt) { return wsrc + static_cast<int64_t>(kt) * (kBW * WT::kRaw); };
  auto s_src = [&](int kt) -> const uint8_t* {
    if constexpr (WT::kScale > 0) return sbase + kt * s_stride;
    else return nullptr;
  };
  // Weight prologue (one cp.async group), then wait for the producer of the activations. The
  // main loop's wait_group count is unchanged: stage 0 completes with this group and its own.
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s)
    if (s < nk) copy_w(s * C::kStageBytes, w_src(kt0 + s), s_src(kt0 + s));
  cp_async_commit();
  pdl_wait();
  pdl_trigger();
  __syncthreads();  // s_slot / s_arow

  // Source offset (bytes, stage 0) and destination of each of this thread's activation chunks,
  // kept in registers for the small (decode) tiles, re-read from s_arow for the large ones;
  // rows past the tile's token count are zero-filled.
  constexpr bool kAReg = kAPer <= 4;
  // Rows at or past `rows_used` (the tile's count rounded up to the 16-token ldmatrix group) are
  // read by no MMA: not copied at all (need = false).
  const int rows_used = min(BT, (cnt + 15) & ~15);
  auto a_chunk = [&](int i, int64_t& src, int& dst, bool& ok, bool& need) {
    const int c = tid + i * kGemmThreads;
    const int r = c / kAChunksRow, q = c % kAChunksRow;
    const int arow = c < kAChunks ? s_arow[r] : -1;
    ok = arow >= 0;
    need = c < kAChunks && r < rows_used;
    src = static_cast<int64_t>(arow < 0 ? 0 : arow) * a.a_row_bytes + q * 16;
    dst = r * C::kAStride + q * 16;
  };
  int64_t a_src[kAReg ? kAPer : 1];
  int a_dst[kAReg ? kAPer : 1];
  bool a_ok[kAReg ? kAPer : 1], a_need[kAReg ? kAPer : 1];
  if constexpr (kAReg) {
#pragma unroll
    for (int i = 0; i < kAPer; ++i) a_chunk(i, a_src[i], a_dst[i], a_ok[i], a_need[i]);
  }
  auto copy_a = [&](uint32_t off, int64_t koff) {  // the tile's activation rows at byte offset koff
    uint8_t* adst = smem + off + C::kWStage + C::kSStage;
#pragma unroll(kAReg ? kAPer : 2)
    for (int i = 0; i < kAPer; ++i) {
      if (kAChunks % kGemmThreads != 0 && tid + i * kGemmThreads >= kAChunks) break;
      int64_t src;
      int dst;
      bool ok, need;
      if constexpr (kAReg) {
        src = a_src[i], dst = a_dst[i], ok = a_ok[i], need = a_need[i];
      } else {
        a_chunk(i, src, dst, ok, need);
      }
      if (!need) continue;
      cp_async16_zfill(adst + dst, abase_hi + src + koff, ok);
      if constexpr (SPLIT) cp_async16_zfill(adst + BT * C::kAStride + dst, abase_lo + src + koff, ok);
    }
  };

  // Accumulators: [m-fragment][token fragment][4].
  using Acc = typename std::conditional<C::kInt8, int, float>::type;
  Acc acc[2][NT][4];
  zero_acc(acc);

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) copy_a(s * C::kStageBytes, static_cast<int64_t>(kt0 + s) * C::kARaw);
    cp_async_commit();
  }

  const int brow_l = (lane & 7) + (BT >= 16 ? (lane >> 4) * 8 : 0);  // ldmatrix row of the token fragment
  // MMAs of the stage in the buffer at byte offset off.
  auto compute = [&](uint32_t off) {
    const uint8_t* st = smem + off;
    const uint8_t* at = st + C::kWStage + C::kSStage;
    F wsrc_f;
    wsrc_f.load(st, st + C::kWStage, warp, lane);
#pragma unroll
    for (int kk = 0; kk < F::kSteps; ++kk) {
      uint32_t af[2][4];
      wsrc_f.get(kk, af);
#pragma unroll
      for (int np = 0; np < NP; ++np) {
        // Token fragments wholly past the tile's count are skipped (the count is uniform over
        // the CTA; their accumulators stay zero and are not stored), so a tile larger than its
        // expert's tokens costs copies and MMAs only for the 16-token groups in use.
        if (np > 0 && np * 16 >= cnt) break;
        // 32 bytes per k step (k16 of 16-bit values, k32 of int8), this lane's 16-byte half.
        const uint8_t* bp = at + (np * 16 + brow_l) * C::kAStride + kk * 32 + ((lane >> 3) & 1) * 16;
        uint32_t bf[4];
        ldsm_b<BT>(bf, bp);
        const bool hi8 = BT >= 16 && np * 16 + 8 < cnt;  // the group's second n8 fragment in use
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_frag<WF>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
          if constexpr (BT >= 16)
            if (hi8) mma_frag<WF>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
        if constexpr (SPLIT) {
          uint32_t bl[4];
          ldsm_b<BT>(bl, bp + BT * C::kAStride);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_frag<WF>(acc[mt][2 * np], af[mt], bl[0], bl[1]);
            if constexpr (BT >= 16)
              if (hi8) mma_frag<WF>(acc[mt][2 * np + 1], af[mt], bl[2], bl[3]);
          }
        }
      }
    }
  };

  // The ring of stage buffers: read at rd, written at wr (kStages − 1 ahead), and the sources of
  // the stage copied next — running values rather than products of the stage index (the modulo
  // and the 64-bit address products cost ~40 issue slots per stage in the SASS).
  constexpr uint32_t kRing = C::kStages * C::kStageBytes;
  auto next_buf = [](uint32_t o) { return o + C::kStageBytes == kRing ? 0u : o + C::kStageBytes; };
  uint32_t rd = 0, wr = (C::kStages - 1) * C::kStageBytes;
  const uint8_t* wk = w_src(kt0 + C::kStages - 1);
  const uint8_t* sk = s_src(kt0 + C::kStages - 1);
  int64_t ak = static_cast<int64_t>(kt0 + C::kStages - 1) * C::kARaw;
  for (int it = 0; it < nk; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    if (it + C::kStages - 1 < nk) {
      copy_w(wr, wk, sk);
      copy_a(wr, ak);
    }
    cp_async_commit();
    compute(rd);
    wk += kBW * WT::kRaw;
    if constexpr (WT::kScale > 0) sk += s_stride;
    ak += C::kARaw;
    rd = next_buf(rd);
    wr = next_buf(wr);
  }
  cp_async_wait<0>();
  store_partials<NT>(a, acc, e, split, n0 + warp * 32, lane, cnt, s_slot, s_arow);
}

template <WFmt WF, int BT, bool SPLIT>
void launch_gemm_t(const GemmArgs& a, dim3 grid, cudaStream_t s) {
  launch_pdl_smem<gemm_kernel<WF, BT, SPLIT>, GemmCfg<WF, BT, SPLIT>::kSmem>(grid, kGemmThreads, s, a);
}

}  // namespace qmoe::cuda

#include "cuda/gemm_wgmma.cuh"

namespace qmoe::cuda {

// The warp-specialised wgmma kernel (gemm_ws_kernel), QMOE_CUDA_WS: unset or 1 — where it is the
// faster kernel (ws_default: persistent, every format but INT8; one CTA per item, bf16 weights with hi +
// lo activations), 0 — never (gemm_wg_kernel everywhere), all — every format it is built for (for
// measurement).
enum class WsMode { Off, Default, All };
inline WsMode ws_mode() {
  static const WsMode m = [] {
    const char* v = std::getenv("QMOE_CUDA_WS");
    if (v == nullptr || std::strcmp(v, "1") == 0) return WsMode::Default;
    if (std::strcmp(v, "0") == 0) return WsMode::Off;
    if (std::strcmp(v, "all") == 0) return WsMode::All;
    throw Error(std::string("QMOE_CUDA_WS = '") + v + "': expected 0, 1 or all");
  }();
  return m;
}

// Dispatch on the token tile; 32- (BF16, INT8), 64- and 128-token tiles run on the warpgroup-MMA
// kernel where the device and the build have it, the format's stages fit, and the caller allows it: `wg` =
// CudaOptions::wgmma && wgmma_available(), resolved once by the caller (gemm_wgmma_host.h).
// 32-token tiles of the register-decode formats stay on mma.sync (measured as fast or faster,
// gemm_wgmma_host.h).
template <WFmt WF, bool SPLIT, int BT>
void launch_gemm_tile(bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if constexpr (WgCfg<WF, SPLIT, BT>::kSupported && (BT != 32 || !WTraits<WF>::kRegDecode)) {
    if (wg) {
      if constexpr (ws_built<WF, SPLIT, BT>()) {
        const WsMode m = ws_mode();
        if (a.a_tma || m == WsMode::All || (m == WsMode::Default && ws_default<WF, SPLIT, BT>(a.persist > 0))) {
          launch_gemm_ws<WF, SPLIT, BT>(a, grid, s);
          return;
        }
      }
      launch_gemm_wg<WF, SPLIT, BT>(a, grid, s);
      return;
    }
  }
  launch_gemm_t<WF, BT, SPLIT>(a, grid, s);
}

// Only the warp-specialised kernels read activation tiles by TMA: a_tma is set by the caller
// where ws_tma_built says the kernel exists (64- and 128-token tiles, wgmma).
template <WFmt WF, bool SPLIT>
constexpr bool ws_tma_built_for(int bt) {
  return bt == 128 ? ws_built<WF, SPLIT, 128>() : bt == 64 ? ws_built<WF, SPLIT, 64>() : false;
}

template <WFmt WF, bool SPLIT>
void launch_gemm_bt(int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  if (a.a_tma && !(wg && ws_tma_built_for<WF, SPLIT>(bt)))
    throw Error("CUDA GEMM: TMA activation tiles need the warp-specialised kernel (64- or 128-token tiles)");
  static_assert(WgCfg<WF, SPLIT>::kSupported ==
                    wgmma_supported(WF, SPLIT ? AFmt::Bf16Split : WF == WFmt::INT8 ? AFmt::Int8 : AFmt::Bf16),
                "wgmma_supported() must match the kernel's configuration");
  switch (bt) {
    case 8: launch_gemm_t<WF, 8, SPLIT>(a, grid, s); break;
    case 16: launch_gemm_t<WF, 16, SPLIT>(a, grid, s); break;
    case 32: launch_gemm_tile<WF, SPLIT, 32>(wg, a, grid, s); break;
    case 64: launch_gemm_tile<WF, SPLIT, 64>(wg, a, grid, s); break;
    default: launch_gemm_tile<WF, SPLIT, 128>(wg, a, grid, s); break;
  }
}

}  // namespace qmoe::cuda
