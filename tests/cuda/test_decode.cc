// The CUDA backend's bit tricks and row quantizers against formats.h / the CPU reference rules,
// code by code (no tolerance: every decode and every quantized operand must be exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cpu/ref/ref_ops.h"
#include "cuda/frag_layout.h"
#include "cuda_test_kernels.h"
#include "qmoe/cuda.h"
#include "qmoe/formats.h"

namespace qmoe::cuda::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!qmoe::cuda::available()) GTEST_SKIP() << "no CUDA device"

float bf16_lo(uint32_t w) { return bf16_decode(static_cast<uint16_t>(w & 0xFFFF)); }
float bf16_hi(uint32_t w) { return bf16_decode(static_cast<uint16_t>(w >> 16)); }
// Equal by value (the sign of zero carries no meaning, spec §16.9); NaN equals NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// The GEMM's register decode on the device (bf16x2 multiplies with subnormal inputs included):
// every code in every position, times every MXFP4 kernel scale byte of shifts 0 and 5 and every
// finite NVFP4 scale.
TEST(CudaDecode, Fp4FragmentsTimesKernelScales) {
  SKIP_WITHOUT_GPU();
  for (const bool nv : {false, true}) {
    std::vector<uint32_t> words, sws;
    std::vector<float> want;  // 8 per word, in register order (a_j low, a_j high)
    std::vector<int> scodes;
    if (nv) {
      for (int c = 1; c < 0x7F; ++c) scodes.push_back(c);
    } else {
      for (int s = 0; s < 255; ++s) scodes.push_back(s);
    }
    for (int shift : nv ? std::vector<int>{0} : std::vector<int>{0, 5}) {
      for (int sc : scodes) {
        if (!nv && (sc > 128 + shift || sc + 5 < shift)) continue;
        const uint8_t kb = nv ? nvfp4_scale_byte(static_cast<uint8_t>(sc)) : mx_fp4_scale_byte(static_cast<uint8_t>(sc), shift);
        const float scale = nv ? fp8_e4m3_decode(static_cast<uint8_t>(sc)) / kNvfp4EpilogueScale
                               : std::ldexp(e8m0_decode(static_cast<uint8_t>(sc)), -shift);
        for (int rot = 0; rot < 16; ++rot) {  // every code in every one of the 8 positions
          uint32_t w = 0;
          float v[8];
          for (int j = 0; j < 4; ++j)
            for (int h = 0; h < 2; ++h) {
              const uint32_t code = static_cast<uint32_t>(rot + 3 * (2 * j + h)) & 15u;
              w |= fp4_frag_place(code, j, h);
              v[2 * j + h] = fp4_e2m1_decode(static_cast<uint8_t>(code)) * scale;
            }
          words.push_back(w);
          sws.push_back(static_cast<uint32_t>(kb) << 16);  // scale byte 2 of the word
          want.insert(want.end(), v, v + 8);
        }
      }
    }
    const auto out = decode_fp4_fragments(nv, words, sws, 2);
    for (size_t i = 0; i < words.size(); ++i)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
          const float got = h ? bf16_hi(out[4 * i + j]) : bf16_lo(out[4 * i + j]);
          ASSERT_TRUE(same(got, want[8 * i + 2 * j + h]))
              << (nv ? "nvfp4" : "mxfp4") << " word " << i << " register " << j << " half " << h << ": got " << got
              << ", want " << want[8 * i + 2 * j + h];
        }
  }
}

TEST(CudaDecode, Fp8AllFiniteCodes) {
  SKIP_WITHOUT_GPU();
  std::vector<uint8_t> bytes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) bytes.push_back(static_cast<uint8_t>(c));
  while (bytes.size() % 4) bytes.push_back(0);
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  const auto out = decode_fp8_units(words);  // fp16x2 words, element i in half i % 2 of word i / 2
  for (size_t i = 0; i < bytes.size(); ++i) {
    const uint32_t w = out[i / 2];
    const float got = fp16_decode(static_cast<uint16_t>((i & 1) ? w >> 16 : w & 0xFFFF));
    ASSERT_TRUE(same(got, fp8_e4m3_decode(bytes[i]))) << "code " << int(bytes[i]);
  }
}

// The activation quantizers' E4M3 codes by the hardware conversion (sm_89+) against the bit walk
// and the reference (formats.h fp8_quantize_act): every code's value and the midpoints between
// neighbours (ties to even), values past ±448, subnormals, ±0, NaN, ±Inf, and random values over
// every exponent, at three scales.
TEST(CudaDecode, E4m3HardwareCodesMatchTheBitWalk) {
  SKIP_WITHOUT_GPU();
  std::vector<float> v;
  std::vector<float> mags;
  for (int c = 0; c < 0x7F; ++c) mags.push_back(fp8_e4m3_decode(static_cast<uint8_t>(c)));
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    const float mid = 0.5f * (mags[i] + mags[i + 1]);
    for (float m : {mags[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) v.push_back(m);
  }
  for (float m : {448.0f, 456.0f, 464.0f, 480.0f, 1e6f, 0x1p-10f, 0x1p-11f, 3 * 0x1p-11f, 0x1p-149f, 1e-30f})
    v.push_back(m);
  std::mt19937 rng(7);
  for (int e = -150; e <= 12; ++e)
    for (int r = 0; r < 24; ++r)
      v.push_back(std::ldexp(1.0f + static_cast<float>(rng() % 8388608u) / 8388608.0f, e));
  const size_t base = v.size();
  for (size_t i = 0; i < base; ++i) v.push_back(-v[i]);
  for (float m : {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY}) v.push_back(m);
  std::vector<float> a(v), b(v);
  std::rotate(b.begin(), b.begin() + 1, b.end());  // pairs of different values
  for (float inv : {1.0f, 1.0f / 0.01f, 1.0f / 37.5f}) {
    const auto r = e4m3x2_codes(a, b, inv);
    for (size_t i = 0; i < a.size(); ++i) {
      const uint16_t want = static_cast<uint16_t>(fp8_quantize_act(a[i], inv) | (fp8_quantize_act(b[i], inv) << 8));
      ASSERT_EQ(r.sw[i], want) << "bit walk: a " << a[i] << " b " << b[i] << " inv " << inv;
      ASSERT_EQ(r.hw[i], want) << "hardware: a " << a[i] << " b " << b[i] << " inv " << inv;
    }
  }
}

// ---- row quantizers vs the reference rules ------------------------------------------------------
struct RowCase {
  ActQuant mode;
  bool split;
  float static_scale;
  bool f16 = false;  // FP8 modes: fp16 operand (FP8-weight GEMMs)
};

class CudaRowQuant : public ::testing::TestWithParam<RowCase> {};
TEST_P(CudaRowQuant, MatchesReferenceQdq) {
  SKIP_WITHOUT_GPU();
  const RowCase rc = GetParam();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int rows = 37, n = 200;  // n not a multiple of 32 / 16: partial last block
  std::vector<float> x(static_cast<size_t>(rows) * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (1.0f + static_cast<float>(i % 7));
  for (int i = 0; i < 8; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero start of a block
  x[n + 5] = 1e-30f;                                             // tiny values
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  RowQuant q;
  q.mode = rc.mode;
  q.split = rc.split;
  q.static_scale = rc.static_scale;
  q.f16 = rc.f16;
  const auto r = quantize_rows(q, x, rows, n, amax);
  ref::ActQuantRule rule;
  rule.kind = rc.mode;
  rule.static_scale = rc.static_scale;
  const float tscale = ref::act_tensor_scale(rule, amax);
  std::vector<double> want(static_cast<size_t>(n));
  for (int row = 0; row < rows; ++row) {
    ref::act_qdq_row(rule, x.data() + static_cast<size_t>(row) * n, n, tscale, want.data());
    for (int i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(row) * n + i;
      double got = 0.0;
      switch (rc.mode) {
        case ActQuant::None: got = static_cast<double>(r.hi[k]) + (rc.split ? r.lo[k] : 0.0f); break;
        case ActQuant::Int8Static: got = static_cast<double>(r.i8[k]) * rc.static_scale; break;
        case ActQuant::Int8DynToken: got = static_cast<double>(r.i8[k]) * r.rowscale[row]; break;
        case ActQuant::Fp8Static: got = static_cast<double>(r.hi[k]) * rc.static_scale; break;
        case ActQuant::Fp8DynToken:
        case ActQuant::Fp8DynTensor: got = static_cast<double>(r.hi[k]) * r.rowscale[row]; break;
        case ActQuant::Nvfp4: got = static_cast<double>(r.hi[k]) / rc.static_scale; break;
        default: got = r.hi[k]; break;  // MX: exact values
      }
      if (rc.mode == ActQuant::None) {
        const double tol = rc.split ? std::fabs(want[i]) * 1e-5 : std::fabs(want[i]) * (1.0 / 256);
        ASSERT_LE(std::fabs(got - want[i]), tol) << "row " << row << " i " << i;
      } else if (rc.mode == ActQuant::Nvfp4) {
        // The operand holds e2m1·s_b exactly; the reference value is e2m1·fl(s_b/gs).
        ASSERT_LE(std::fabs(got - want[i]), std::fabs(want[i]) * 3e-7) << "row " << row << " i " << i;
      } else {
        ASSERT_EQ(got, want[i]) << "row " << row << " i " << i << " x " << x[k];
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(
    AllRules, CudaRowQuant,
    ::testing::Values(RowCase{ActQuant::None, true, 0}, RowCase{ActQuant::None, false, 0},
                      RowCase{ActQuant::Mxfp4, false, 0}, RowCase{ActQuant::Mxfp6E2M3, false, 0},
                      RowCase{ActQuant::Mxfp6E3M2, false, 0}, RowCase{ActQuant::Nvfp4, false, 448.0f * 6.0f / 20.0f},
                      RowCase{ActQuant::Fp8Static, false, 0.01f}, RowCase{ActQuant::Fp8DynToken, false, 0},
                      RowCase{ActQuant::Fp8DynTensor, false, 0}, RowCase{ActQuant::Fp8Static, false, 0.01f, true},
                      RowCase{ActQuant::Fp8DynToken, false, 0, true}, RowCase{ActQuant::Int8Static, false, 0.05f},
                      RowCase{ActQuant::Int8DynToken, false, 0}));

}  // namespace
}  // namespace qmoe::cuda::test
