// The CUDA backend's bit tricks and row quantizers against formats.h / the CPU reference rules,
// code by code (no tolerance: every decode and every quantized operand must be exact).
#include <gtest/gtest.h>

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
float elem(const std::vector<uint32_t>& out, size_t unit, int i) {
  const uint32_t w = out[unit * 16 + static_cast<size_t>(i / 2)];
  return (i & 1) ? bf16_hi(w) : bf16_lo(w);
}
// Equal by value (the sign of zero carries no meaning, spec §16.9); NaN equals NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(CudaDecode, ScalarsMatchFormats) {
  SKIP_WITHOUT_GPU();
  const auto e8 = e8m0_all();
  const auto f8 = fp8_all();
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(same(e8[c], e8m0_decode(static_cast<uint8_t>(c)))) << "e8m0 byte " << c;
    EXPECT_TRUE(same(f8[c], fp8_e4m3_decode(static_cast<uint8_t>(c)))) << "fp8 code " << c;
  }
}

TEST(CudaDecode, Fp4AllBytesTimesScales) {
  SKIP_WITHOUT_GPU();
  // Units: 16 bytes each = 32 codes. All 256 bytes appear, with E8M0 scales incl. the extremes
  // that stay finite in fp32 (x·2^(s−127) for s ≤ 252 and 6·2^125 < FLT_MAX), and FP8 scales.
  std::vector<uint8_t> bytes;
  std::vector<float> muls;
  std::vector<float> scale_values;
  for (int s : {1, 60, 100, 118, 127, 128, 140, 200, 252}) scale_values.push_back(e8m0_decode(static_cast<uint8_t>(s)));
  for (int c = 0x01; c < 0x7F; c += 3) scale_values.push_back(fp8_e4m3_decode(static_cast<uint8_t>(c)));
  for (float sv : scale_values)
    for (int b0 = 0; b0 < 256; b0 += 16) {
      for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<uint8_t>(b0 + j));
      muls.push_back(sv);
      muls.push_back(sv * 2.0f);  // second half with another scale
    }
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  const auto out = decode_fp4_units(words, muls);
  for (size_t u = 0; u < bytes.size() / 16; ++u)
    for (int i = 0; i < 32; ++i) {
      const float want = fp4_e2m1_decode(fp4_code_at(bytes.data() + u * 16, i)) * muls[2 * u + (i >= 16)];
      ASSERT_TRUE(same(elem(out, u, i), want)) << "unit " << u << " element " << i << " scale " << muls[2 * u];
    }
}

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

class CudaDecodeFp6 : public ::testing::TestWithParam<bool> {};
TEST_P(CudaDecodeFp6, AllCodesPackedAndScaled) {
  SKIP_WITHOUT_GPU();
  const bool e3m2 = GetParam();
  std::mt19937 rng(7);
  std::vector<uint8_t> packed;
  std::vector<uint8_t> codes;
  std::vector<float> muls;
  for (int u = 0; u < 64; ++u) {
    uint8_t c[32];
    for (int i = 0; i < 32; ++i) c[i] = static_cast<uint8_t>(u < 2 ? (u * 32 + i) : rng() & 0x3F);  // all 64 codes first
    uint8_t p[24];
    pack_fp6(c, 32, p);
    packed.insert(packed.end(), p, p + 24);
    codes.insert(codes.end(), c, c + 32);
    muls.push_back(e8m0_decode(static_cast<uint8_t>(100 + u)));
  }
  std::vector<uint32_t> words(packed.size() / 4);
  std::memcpy(words.data(), packed.data(), packed.size());
  const auto out = decode_fp6_units(e3m2, words, muls);
  for (size_t u = 0; u < 64; ++u)
    for (int i = 0; i < 32; ++i) {
      const uint8_t c = fp6_code_at(packed.data() + u * 24, i);
      ASSERT_EQ(c, codes[u * 32 + i]);
      const float v = e3m2 ? fp6_e3m2_decode(c) : fp6_e2m3_decode(c);
      ASSERT_TRUE(same(elem(out, u, i), v * muls[u])) << "unit " << u << " element " << i << " code " << int(c);
    }
}
INSTANTIATE_TEST_SUITE_P(Both, CudaDecodeFp6, ::testing::Values(false, true));

TEST(CudaDecode, Fp8AllFiniteCodes) {
  SKIP_WITHOUT_GPU();
  std::vector<uint8_t> bytes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) bytes.push_back(static_cast<uint8_t>(c));
  while (bytes.size() % 32) bytes.push_back(0);
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  const auto out = decode_fp8_units(words);  // fp16x2 words
  for (size_t u = 0; u < bytes.size() / 32; ++u)
    for (int i = 0; i < 32; ++i) {
      const uint32_t w = out[u * 16 + static_cast<size_t>(i / 2)];
      const float got = fp16_decode(static_cast<uint16_t>((i & 1) ? w >> 16 : w & 0xFFFF));
      ASSERT_TRUE(same(got, fp8_e4m3_decode(bytes[u * 32 + i]))) << "code " << int(bytes[u * 32 + i]);
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
