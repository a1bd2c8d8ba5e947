// The device quantizers' fast quantize-dequantize (src/cuda/qdq_fast.h) against formats.h's
// encode → decode, bit for bit: every exponent field of fp32 with random and edge mantissas, both
// signs, ties; and the MX element path for every shared exponent.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda/qdq_fast.h"
#include "qmoe/formats.h"

namespace qmoe::cuda {
namespace {

// Values to try: every fp32 exponent field with mantissas 0, 1, all-ones, the grid's tie points
// (a half-step bit alone and with the bit above it) and random ones; both signs; ±0, ±Inf, NaN.
std::vector<float> probe_values(uint64_t seed) {
  std::vector<float> v;
  std::mt19937_64 rng(seed);
  for (uint32_t field = 0; field < 256; ++field)
    for (int s = 0; s < 2; ++s) {
      const uint32_t base = (static_cast<uint32_t>(s) << 31) | (field << 23);
      std::vector<uint32_t> mant = {0u, 1u, 0x7FFFFFu, 0x400000u, 0x200000u, 0x600000u, 0x100000u, 0x300000u,
                                    0x080000u, 0x180000u, 0x0C0000u, 0x040000u};
      for (int r = 0; r < 64; ++r) mant.push_back(static_cast<uint32_t>(rng()) & 0x7FFFFFu);
      for (uint32_t m : mant) v.push_back(bits_to_f32(base | m));
    }
  return v;
}

bool same_bits(float a, float b) { return (a != a && b != b) || f32_to_bits(a) == f32_to_bits(b); }

template <class F, class Encode, class Decode>
void check_format(const char* name, Encode enc, Decode dec, bool nan_is_max) {
  int checked = 0;
  for (float y : probe_values(7)) {
    const float want = y != y && nan_is_max ? F::kMax : dec(enc(y));
    const float got = minifloat_qdq<F>(y);
    ASSERT_TRUE(same_bits(got, want)) << name << ": y = " << y << " (bits 0x" << std::hex << f32_to_bits(y)
                                      << ") fast " << got << " reference " << want;
    ++checked;
  }
  EXPECT_EQ(checked, 256 * 2 * 76);  // every probe value was compared
}

TEST(CudaQdqFast, Fp4MatchesEncodeDecode) {
  check_format<QdqFp4E2M1>("fp4", fp4_e2m1_encode, fp4_e2m1_decode, true);
}
TEST(CudaQdqFast, Fp6E2M3MatchesEncodeDecode) {
  check_format<QdqFp6E2M3>("e2m3", fp6_e2m3_encode, fp6_e2m3_decode, true);
}
TEST(CudaQdqFast, Fp6E3M2MatchesEncodeDecode) {
  check_format<QdqFp6E3M2>("e3m2", fp6_e3m2_encode, fp6_e3m2_decode, true);
}
// FP8: the callers clamp to ±448 first (NaN → −448, as fp8_quantize_act does), so only finite
// inputs reach it; compare on the clamped values.
TEST(CudaQdqFast, Fp8E4M3MatchesEncodeDecodeOnClampedInputs) {
  for (float y : probe_values(11)) {
    const float c = fminf(fmaxf(y, -kFp8E4M3Max), kFp8E4M3Max);
    const float want = fp8_e4m3_decode(fp8_e4m3_encode(c));
    const float got = minifloat_qdq<QdqFp8E4M3>(c);
    ASSERT_TRUE(same_bits(got, want)) << "e4m3: y = " << y << " fast " << got << " reference " << want;
  }
}

// The FP8 activation path as row_quant.cuh calls it: scale, clamp (NaN → −448), round trip.
TEST(CudaQdqFast, Fp8ActivationMatchesQuantizeAct) {
  for (float inv : {1.0f, 0.37f, 1.0f / 448.0f, 3.0e4f}) {
    for (float y : probe_values(13)) {
      const float want = fp8_e4m3_decode(fp8_quantize_act(y, inv));
      const float got = qdq_fp8_act(y, inv);
      ASSERT_TRUE(same_bits(got, want)) << "y = " << y << " inv " << inv << " fast " << got << " reference " << want;
    }
  }
}

// The e4m3 activation codes of the fp8 tensor-core path (AFmt::E4m3): every code's value back to
// the code, and the whole activation path byte for byte against fp8_quantize_act.
TEST(CudaQdqFast, E4m3CodeInvertsDecodeAndMatchesQuantizeAct) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN: never a qdq_fp8_act result
    const int want = c == 0x80 ? 0 : c;  // −0 is encoded as +0
    ASSERT_EQ(e4m3_code(fp8_e4m3_decode(static_cast<uint8_t>(c))), want) << "code " << c;
  }
  for (float inv : {1.0f, 0.37f, 1.0f / 448.0f, 3.0e4f})
    for (float y : probe_values(17))
      ASSERT_EQ(e4m3_code(qdq_fp8_act(y, inv)), fp8_quantize_act(y, inv)) << "y = " << y << " inv " << inv;
  // The pair form (the host's bit walk; the device's hardware conversion is checked on a GPU by
  // CudaDecode.E4m3HardwareCodesMatchTheBitWalk): the first value in the low byte.
  const std::vector<float> ys = probe_values(5);
  for (size_t i = 0; i + 1 < ys.size(); ++i) {
    const uint16_t want = static_cast<uint16_t>(fp8_quantize_act(ys[i], 0.37f) | (fp8_quantize_act(ys[i + 1], 0.37f) << 8));
    ASSERT_EQ(e4m3x2_act_codes(ys[i], ys[i + 1], 0.37f), want) << "y = " << ys[i] << ", " << ys[i + 1];
    ASSERT_EQ(e4m3x2_act_codes_sw(ys[i], ys[i + 1], 0.37f), want) << "y = " << ys[i] << ", " << ys[i + 1];
  }
}

// The row order of AFmt::E4m3 is a permutation of each 16-element chunk.
TEST(CudaQdqFast, E4m3ActPositionsPermuteEachChunk) {
  for (int base : {0, 16, 4096}) {
    std::vector<int> seen(16, 0);
    for (int k = 0; k < 16; ++k) {
      const int p = e4m3_act_pos(base + k);
      ASSERT_EQ(p & ~15, base);
      ++seen[p & 15];
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
  EXPECT_EQ(e4m3_act_pos(2), 4);   // element 2c (c = 1) to slot 4c
  EXPECT_EQ(e4m3_act_pos(9), 3);   // element 8 + 2c + 1 (c = 0) to slot 4c + 3
  EXPECT_EQ(e4m3_act_pos(15), 15);
}

TEST(CudaQdqFast, Exp2iIsExact) {
  for (int n = -149; n <= 127; ++n) ASSERT_EQ(exp2i(n), std::ldexp(1.0f, n)) << n;
}

// The MX element path: ldexpf(decode(encode(ldexpf(x, −shared))), shared) for every shared
// exponent, on values spread around the block's range (and far outside it).
TEST(CudaQdqFast, MxElementsMatchReferenceForEveryShift) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> off(-30, 6);
  const MxElem els[] = {MxElem::Fp4E2M1, MxElem::Fp6E2M3, MxElem::Fp6E3M2};
  for (MxElem el : els)
    for (int shared = -127; shared <= 127; ++shared)
      for (int i = 0; i < 200; ++i) {
        const float x = std::ldexp(mant(rng), shared + off(rng));
        const float want = std::ldexp(mx_elem_decode(el, mx_elem_encode(el, std::ldexp(x, -shared))), shared);
        const float got = el == MxElem::Fp4E2M1   ? mx_qdq<QdqFp4E2M1>(x, shared)
                          : el == MxElem::Fp6E2M3 ? mx_qdq<QdqFp6E2M3>(x, shared)
                                                  : mx_qdq<QdqFp6E3M2>(x, shared);
        ASSERT_TRUE(same_bits(got, want)) << "elem " << static_cast<int>(el) << " shared " << shared << " x " << x
                                          << " fast " << got << " reference " << want;
      }
}

}  // namespace
}  // namespace qmoe::cuda
