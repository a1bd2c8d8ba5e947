// Host side of the wgmma prefill kernels (gemm_wgmma.cuh).
#pragma once

#include <iterator>

#include "cuda/cuda_common.h"

namespace qmoe::cuda {

// Formats the wgmma kernel takes with 128-token tiles (3 pipeline stages must fit in shared
// memory): all but MXFP6 with the bf16 hi + lo split (checked against WgCfg<>::kSupported at compile
// time, gemm.cuh). The 32- and 64-token tiles fall back to the mma.sync kernel by themselves where
// their stages do not fit (launch_gemm_tile).
constexpr bool wgmma_supported(WFmt f, AFmt a) {
  return !((f == WFmt::MXFP6_E2M3 || f == WFmt::MXFP6_E3M2) && a == AFmt::Bf16Split);
}

// The token tile of a GEMM launch, by weight format and mean tokens per active expert, as data.
// First measured on the H200 (bench/RESULTS.md, "Token tiles on wgmma", 2026-12-02: mixtral-8x7b,
// qwen3-30b-a3b, deepseek-v3, gpt-oss-120b, T = 16…1024, every tile forced on both kernels); the
// register-decode rows re-measured on an H100 (bench/RESULTS.md 2026-12-05 evening, "Token tiles
// at 24–1024 tokens per expert": +tile32 / +tile64 / +tile128 forced at 24…128 tokens per expert
// on mixtral-8x7b, gpt-oss-120b, qwen3-30b-a3b and deepseek-v3).
// A row applies while mean < below. `wg`: the device and the build run the wgmma kernels; tiles of
// 32 and up then run on them where the format's stages fit (launch_gemm_tile), except 32-token
// tiles of the register-decode formats, whose mma.sync kernel is as fast or faster there.
//  * shared-memory-A formats (BF16, INT8): wgmma from the first token — its 32-token tile beats
//    the mma.sync 8 / 16 tiles even at ~1 token per expert (INT8: 1096 vs 1132 µs, deepseek-v3
//    T = 16), 64 from a mean of 24, 128 from 64;
//  * FP8: 8 / 16 / 32 (mma.sync), wgmma 64 from a mean of 32 (deepseek-v3 T = 1024: 4408 vs
//    4893 µs on mma.sync 32), 128 from 64;
//  * the other register-decode formats (FP4, FP6; W4A4, W6A6, W4A8, bf16 activations): 8 / 16 /
//    32 to a mean of 26 (FP4) / 20 (FP6), wgmma 64 to 60, 128 above. One pass over an expert's
//    weights per tile is what counts: at 40–56 tokens per expert the 32-token tile streams the
//    weights twice and the 128-token tile wastes half its MMAs (mixtral-8x7b W4A4 at 48: 673 / 516
//    / 726 µs on 32 / 64 / 128, gpt-oss-120b 1759 / 1352 / 1812); at 64 the 128-token tile on
//    mixtral (747 vs 881; gpt-oss-120b 1898 vs 1815). The 32 → 64 step re-measured after the
//    persistent warp-specialised 64-token kernel (H100, bench/RESULTS.md 2026-12-07, session 45:
//    +tile32 / +tile64 at 20 / 24 / 28 / 32 tokens per expert on deepseek-v3, gpt-oss-120b and
//    mixtral-8x7b): FP4 (W4A4, NVFP4, W4A16 +bf16act) 32 ahead by 3–17 % at 20, 0–10 % at 24
//    (W4A16 on deepseek-v3 the other way), 64 ahead or level at 28 and by 4–24 % at 32 (deepseek-v3
//    W4A4 3951 vs 3207 µs); MXFP6 W6A6 64 ahead or level from 20 (deepseek-v3 3761 vs 3433);
//  * `split` (fp32-accurate activations as bf16 hi + lo: twice the activation stage; the weight-only
//    FP4 / FP6 schemes, whose GEMM1 runs unsplit on a bf16 input but whose GEMM2 still splits):
//    16-token tiles to a mean of 16, 32 to 20, then 64 at every size. Re-measured on an H100
//    (bench/RESULTS.md 2026-12-07, session 46: w_mxfp4 / w_mxfp6 with fp32 and bf16 inputs, +tile16
//    / 32 / 64 at 4…48 tokens per expert on mixtral-8x7b, qwen3-30b-a3b, gpt-oss-120b): at 20–28
//    the 64-token tile is 1.0–1.3× the 16 / 32 ones (mixtral-8x7b w_mxfp4 at 20 / 24: 648 / 688 µs
//    on 16 against 491 / 499 on 64), qwen3-30b-a3b at 24 the one point the other way (32 ahead by
//    3–13 %); at 16 the three are within 8 % (before: 16 to 24, 32 to 40). Never 128: that tile
//    with both halves leaves too few stages (mixtral-8x7b w_mxfp4 at 256 / 1024 tokens per expert: 3009 / 11505 µs
//    on 64 against 3748 / 13149 on 128; MXFP6, which has no 128-token wgmma tile with the split,
//    3580 / 12541 on 64 against 5066 / 22798 on mma.sync 32);
//  * without wgmma: 8 / 16 / 32, 64 from a mean of 48 for BF16 / INT8, 128 above 256 (the rule
//    before this table; not re-measured).
struct TileRow {
  double below;
  int bt;
};
inline int token_tile_for(WFmt f, double mean, bool wg, bool split) {
  static constexpr TileRow kSmemA[] = {{24, 32}, {64, 64}, {1e300, 128}};
  static constexpr TileRow kRegFp8[] = {{4.5, 8}, {12.5, 16}, {32, 32}, {64, 64}, {1e300, 128}};
  static constexpr TileRow kReg[] = {{4.5, 8}, {12.5, 16}, {26, 32}, {60, 64}, {1e300, 128}};
  static constexpr TileRow kRegFp6[] = {{4.5, 8}, {12.5, 16}, {20, 32}, {60, 64}, {1e300, 128}};
  static constexpr TileRow kRegSplit[] = {{4.5, 8}, {16.5, 16}, {20, 32}, {1e300, 64}};
  // MXFP6 has no 128-token wgmma tile with the split (wgmma_supported): the split rows never ask for it.
  static_assert(kRegSplit[std::size(kRegSplit) - 1].bt == 64, "the split rows stop at the 64-token tile");
  static constexpr TileRow kNoWgSmemA[] = {{4.5, 8}, {12.5, 16}, {48, 32}, {256.5, 64}, {1e300, 128}};
  static constexpr TileRow kNoWg[] = {{4.5, 8}, {12.5, 16}, {256.5, 32}, {1e300, 128}};
  const bool smem_a = f == WFmt::BF16 || f == WFmt::INT8;
  auto pick = [mean](const auto& rows) {
    for (const TileRow& r : rows)
      if (mean < r.below) return r.bt;
    return 128;
  };
  if (!wg) return smem_a ? pick(kNoWgSmemA) : pick(kNoWg);
  if (smem_a) return pick(kSmemA);
  if (f == WFmt::FP8) return pick(kRegFp8);
  if (split) return pick(kRegSplit);
  return f == WFmt::MXFP6_E2M3 || f == WFmt::MXFP6_E3M2 ? pick(kRegFp6) : pick(kReg);
}

// True when the current device runs this build's wgmma kernels: the library was compiled with an
// sm_90a image (QMOE_CUDA_SM90A) and the device has compute capability 9.0. QMOE_CUDA_WGMMA=0 in
// the environment turns them off for the process.
bool wgmma_available();

}  // namespace qmoe::cuda
