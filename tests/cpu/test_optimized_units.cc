// Unit tests of the optimized CPU kernels' building blocks, per ISA:
//  * activation quantizers: bit-for-bit the values of ref::act_qdq_row (every rule, every layout),
//    including RNE ties, saturation and tiny / zero blocks;
//  * in-register weight decoding (the bit tricks / tables): every code of every format equals
//    formats.h, read back through the GEMM with unit activation vectors;
//  * integer GEMM kinds against the scalar kernel;
//  * gated activations against ref::apply_activation_row (≤ 1 ulp);
//  * the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cpu/kernel_iface.h"
#include "cpu/ref/ref_ops.h"
#include "cpu/thread_pool.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/schemes.h"

namespace qmoe::cpu {
namespace {

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : kAllIsas)
    if (isa_supported(i)) v.push_back(i);
  return v;
}

// Whether `isa`'s kernels implement `kind` (dot_kind_for selects it there): only the scalar,
// avx512bf16 and amx targets have Bf16.
bool implements(Isa isa, DotKind kind) {
  if (kind == DotKind::Bf16) return isa == Isa::Scalar || isa == Isa::Avx512Bf16 || isa == Isa::Amx;
  return true;
}

// One GEMM task over rows [row0, row1) of w for act rows index[0 .. ntok) at act_base; out[j·ldo + n].
GemmArgs gemm_args(const WeightView& w, const ActLayout& layout, const uint8_t* act_base, const int32_t* index, int ntok,
                   int row0, int row1, float* out, int64_t ldo) {
  GemmArgs g;
  g.w = &w;
  g.layout = &layout;
  g.act_base = act_base;
  g.act_index = index;
  g.ntok = ntok;
  g.row0 = row0;
  g.row1 = row1;
  g.out = out;
  g.ldo = ldo;
  return g;
}

// Rows that exercise rounding: random normals at several magnitudes, exact grid midpoints, zeros,
// a zero block, huge values, subnormal-scale blocks.
std::vector<std::vector<float>> test_rows(int k, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> rows;
  for (float mag : {1.0f, 1e-3f, 300.0f, 1e-30f}) {
    std::vector<float> r(static_cast<size_t>(k));
    for (float& v : r) v = nd(rng) * mag;
    rows.push_back(r);
  }
  // Midpoints of the fp4 / fp6 / fp8 / int8 grids at block scale 1 (amax 6 → shared exponent 0
  // for fp4; 7.5 for e2m3 etc.), with the block maximum set so the scale is a power of two.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.0625f, 0.1875f, 2.25f, 6.5f, 7.25f,
                        0.5f,  1.5f,  2.5f,  -0.25f, -0.75f, -2.5f, -5.0f, 0.0f, -0.0f, 3.0f, 4.5f, 1.0f};
  std::vector<float> t(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) t[static_cast<size_t>(i)] = (i % 32 == 0) ? 6.0f : ties[i % 24];
  rows.push_back(t);
  std::vector<float> z(static_cast<size_t>(k), 0.0f);
  for (int i = k / 2; i < k; ++i) z[static_cast<size_t>(i)] = nd(rng);
  rows.push_back(z);  // leading zero blocks
  std::vector<float> h(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) h[static_cast<size_t>(i)] = (i % 3 == 0 ? 1e6f : -2.0f) * (1.0f + 0.01f * static_cast<float>(i));
  rows.push_back(h);  // saturating values
  std::vector<float> ip(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) ip[static_cast<size_t>(i)] = static_cast<float>(i % 9) - 4.0f + ((i % 4 == 1) ? 0.5f : 0.0f);
  ip[0] = 127.0f;
  rows.push_back(ip);  // int8 dynamic: amax 127 → inv 1, exact .5 ties
  return rows;
}

struct RuleCase {
  ActQuant kind;
  float scale;
};

TEST(OptimizedUnits, ActQuantizersMatchReference) {
  std::mt19937 rng(5);
  const std::vector<RuleCase> rules = {
      {ActQuant::None, 0.0f},           {ActQuant::Fp8Static, 0.0123f},   {ActQuant::Fp8DynToken, 0.0f},
      {ActQuant::Fp8DynTensor, 0.0f},   {ActQuant::Int8Static, 0.25f},    {ActQuant::Int8Static, 0.0371f},
      {ActQuant::Int8DynToken, 0.0f},   {ActQuant::Mxfp4, 0.0f},          {ActQuant::Mxfp6E2M3, 0.0f},
      {ActQuant::Mxfp6E3M2, 0.0f},      {ActQuant::Nvfp4, 672.0f},        {ActQuant::Nvfp4, 3.1f},
  };
  for (const RuleCase& rc : rules) {
    ref::ActQuantRule rule;
    rule.kind = rc.kind;
    rule.static_scale = rc.scale;
    for (MxScaleMode mode : {MxScaleMode::Even, MxScaleMode::Floor}) {
      rule.mx_mode = mode;
      // Layouts that can consume this rule.
      struct L {
        DotKind kind;
        WeightFormat consumer;
      };
      std::vector<L> layouts = {{DotKind::F32, WeightFormat::Mxfp6E2M3}, {DotKind::F32, WeightFormat::Mxfp4},
                                {DotKind::Bf16, WeightFormat::Mxfp6E2M3}, {DotKind::Bf16, WeightFormat::Mxfp4}};
      if (rc.kind == ActQuant::Int8Static || rc.kind == ActQuant::Int8DynToken) layouts.push_back({DotKind::I8, WeightFormat::Int8});
      if (rc.kind == ActQuant::Mxfp4 || rc.kind == ActQuant::Mxfp6E2M3) layouts.push_back({DotKind::Fp4Mx, WeightFormat::Mxfp4});
      if (rc.kind == ActQuant::Mxfp6E2M3) layouts.push_back({DotKind::Fp4Mx, WeightFormat::Mxfp6E2M3});
      if (rc.kind == ActQuant::Nvfp4) layouts.push_back({DotKind::Fp4Nv, WeightFormat::Nvfp4});
      const bool mx = rc.kind == ActQuant::Mxfp4 || rc.kind == ActQuant::Mxfp6E2M3 || rc.kind == ActQuant::Mxfp6E3M2;
      std::vector<int> ks = {32, 64, 96, 160};
      if (!mx) ks.push_back(48);
      if (!mx && rc.kind != ActQuant::Nvfp4) ks.push_back(40);
      for (int k : ks) {
        for (const auto& row : test_rows(k, rng)) {
          const float tscale = fp8_tensor_scale(ref::abs_max(row.data(), k));
          std::vector<float> want(static_cast<size_t>(k));
          ref::act_qdq_row(rule, row.data(), k, tscale, want.data());
          for (const L& lc : layouts) {
            if ((lc.kind == DotKind::Fp4Nv || lc.consumer == WeightFormat::Mxfp4) && k % 16 != 0) continue;
            const ActLayout layout = make_act_layout(lc.kind, lc.consumer, k);
            for (Isa isa : isas()) {
              if (!implements(isa, lc.kind)) continue;
              std::vector<uint8_t> buf(static_cast<size_t>(layout.stride), 0xCD);
              QuantRowArgs q{&rule, &layout, tscale, row.data(), buf.data()};
              kernel_table(isa).quantize_row(q);
              std::vector<double> got(static_cast<size_t>(k));
              act_row_values(layout, buf.data(), got.data());
              // The Bf16 kind keeps NVFP4's e2m1 · fp8 block scale as one exact bf16 term and the
              // tensor's 1/gs as the row scale: the same codes and block scales, the product with
              // the per-tensor factor rounded once in another place (≤ 2 fp32 ulp from the
              // reference's e2m1 · fl(sb / gs)); every other layout is bit-identical.
              const bool nv_bf16 = rc.kind == ActQuant::Nvfp4 && lc.kind == DotKind::Bf16;
              for (int i = 0; i < k; ++i) {
                const float g = static_cast<float>(got[static_cast<size_t>(i)]);
                if (nv_bf16) {
                  const float wv = want[static_cast<size_t>(i)];
                  ASSERT_LE(std::fabs(g - wv), 2.0f * (std::nextafter(std::fabs(wv), INFINITY) - std::fabs(wv)))
                      << fmt::format("NVFP4 on the Bf16 kind: k {} isa {} element {}", k, isa_name(isa), i);
                  continue;
                }
                ASSERT_EQ(g, want[static_cast<size_t>(i)])
                    << fmt::format("rule {} scale {} mode {} kind {} k {} isa {} element {} x {}", to_string(rc.kind), rc.scale,
                                   static_cast<int>(mode), static_cast<int>(lc.kind), k, isa_name(isa), i,
                                   row[static_cast<size_t>(i)]);
              }
              // Positions holding no element are zero.
              std::vector<bool> used(static_cast<size_t>(layout.k_pad), false);
              for (int i = 0; i < k; ++i) used[static_cast<size_t>(act_value_position(layout, i))] = true;
              for (int64_t t = 0; t < layout.vals_bytes / layout.term_bytes; ++t)  // every term row (Bf16)
                for (int p = 0; p < layout.k_pad; ++p)
                  if (!used[static_cast<size_t>(p)]) {
                    uint8_t z[4] = {};
                    ASSERT_EQ(0, std::memcmp(buf.data() + layout.vals_off + t * layout.term_bytes +
                                                 static_cast<int64_t>(p) * layout.elem_bytes,
                                             z, static_cast<size_t>(layout.elem_bytes)))
                        << "padding at " << p << " term " << t << " isa " << isa_name(isa);
                  }
              if (lc.kind == DotKind::Bf16) {  // terms and term count: those of the scalar split
                std::vector<uint8_t> sref(static_cast<size_t>(layout.stride), 0xAB);
                QuantRowArgs qs{&rule, &layout, tscale, row.data(), sref.data()};
                quantize_row_scalar(qs);
                ASSERT_EQ(0, std::memcmp(sref.data(), buf.data(), 12)) << "header, isa " << isa_name(isa);
                for (int64_t e = 0; e < layout.vals_bytes / 2; ++e) {  // by value: the sign of zero is free (§16.9)
                  uint16_t hs, hg;
                  std::memcpy(&hs, sref.data() + layout.vals_off + 2 * e, 2);
                  std::memcpy(&hg, buf.data() + layout.vals_off + 2 * e, 2);
                  ASSERT_EQ(bf16_decode(hs), bf16_decode(hg)) << "term word " << e << ", isa " << isa_name(isa);
                }
                int32_t nt;
                std::memcpy(&nt, buf.data() + 8, 4);
                ASSERT_GE(nt, 1);
                ASSERT_LE(nt, kBf16Terms);
                if (rc.kind != ActQuant::None && rc.kind != ActQuant::Nvfp4) {  // NVFP4 values carry deq = sb / gs
                  ASSERT_EQ(nt, 1) << "quantized values are exact in bf16";
                }
              }
              if (lc.kind == DotKind::I8) {  // the code sum used by the VNNI offset trick
                int32_t sum, want_sum = 0;
                std::memcpy(&sum, buf.data() + 4, 4);
                for (int i = 0; i < k; ++i) want_sum += static_cast<int8_t>(buf[static_cast<size_t>(layout.vals_off + i)]);
                ASSERT_EQ(sum, want_sum) << isa_name(isa);
              }
            }
          }
        }
      }
      if (!mx) break;  // the mode only matters for MX rules
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Weight decoding: a row holding every code of the format (and every scale byte of interest),
// read through the GEMM with unit activations e_j, must give formats.h's value of element j.
struct DecodeCase {
  std::string name;
  WeightFormat fmt;
  DType dtype;
  int K;
  std::vector<uint8_t> row;     // packed row bytes
  std::vector<uint8_t> scales;  // block scales of the row (MX / NVFP4)
  float nv_global = 1.0f;
  std::vector<float> want;      // [K]
};

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> v;
  {  // FP8 E4M3: all 254 non-NaN codes (+ 2 zeros to fill 256)
    DecodeCase c{"fp8", WeightFormat::Fp8E4M3, DType::F8_E4M3, 256, {}, {}, 1.0f, {}};
    for (int i = 0; i < 256; ++i) {
      uint8_t code = static_cast<uint8_t>(i);
      if ((code & 0x7F) == 0x7F) code = 0;
      c.row.push_back(code);
      c.want.push_back(fp8_e4m3_decode(code));
    }
    v.push_back(c);
  }
  {  // INT8: all codes
    DecodeCase c{"int8", WeightFormat::Int8, DType::I8, 256, {}, {}, 1.0f, {}};
    for (int i = 0; i < 256; ++i) {
      c.row.push_back(static_cast<uint8_t>(i));
      c.want.push_back(static_cast<float>(static_cast<int8_t>(i)));
    }
    v.push_back(c);
  }
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {  // unquantized storage
    DecodeCase c{std::string("unquantized_") + std::string(dtype_name(dt)), WeightFormat::BF16, dt, 72, {}, {}, 1.0f, {}};
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (int i = 0; i < c.K; ++i) {
      float val = nd(rng) * (i < 8 ? 1e-6f : 3.0f);
      if (dt == DType::BF16) {
        const uint16_t h = bf16_encode(val);
        c.row.push_back(static_cast<uint8_t>(h));
        c.row.push_back(static_cast<uint8_t>(h >> 8));
        val = bf16_decode(h);
      } else if (dt == DType::F16) {
        const uint16_t h = fp16_encode(val);
        c.row.push_back(static_cast<uint8_t>(h));
        c.row.push_back(static_cast<uint8_t>(h >> 8));
        val = fp16_decode(h);
      } else {
        uint8_t b[4];
        std::memcpy(b, &val, 4);
        c.row.insert(c.row.end(), b, b + 4);
      }
      c.want.push_back(val);
    }
    v.push_back(c);
  }
  // MXFP4 / MXFP6: every code in blocks with scale bytes 0 (2^-127), 1, 100, 127, 150, 200; and
  // with bytes 5 … 250 only (the Bf16 kind's exponent trick is exact there; below / above, its row
  // blocks take the scalar kernel).
  for (int set = 0; set < 2; ++set)
  for (WeightFormat f : {WeightFormat::Mxfp4, WeightFormat::Mxfp6E2M3, WeightFormat::Mxfp6E3M2}) {
    const uint8_t sbytes_all[2][6] = {{0, 1, 100, 127, 150, 200}, {5, 60, 127, 150, 200, 250}};
    const uint8_t* sbytes = sbytes_all[set];
    const int ncodes = f == WeightFormat::Mxfp4 ? 16 : 64;
    DecodeCase c{std::string(to_string(f)) + (set ? "_bf16_window" : ""), f, DType::U8, 32 * 6, {}, {}, 1.0f, {}};
    std::vector<uint8_t> codes;
    for (int b = 0; b < 6; ++b) {
      c.scales.push_back(sbytes[b]);
      for (int j = 0; j < 32; ++j) {
        const uint8_t code = static_cast<uint8_t>((b * 32 + j * 7) % ncodes);
        codes.push_back(code);
        const float e = f == WeightFormat::Mxfp4 ? fp4_e2m1_decode(code) : f == WeightFormat::Mxfp6E2M3 ? fp6_e2m3_decode(code) : fp6_e3m2_decode(code);
        c.want.push_back(std::ldexp(e, static_cast<int>(sbytes[b]) - 127));
      }
    }
    c.row.resize(f == WeightFormat::Mxfp4 ? codes.size() / 2 : codes.size() * 3 / 4);
    if (f == WeightFormat::Mxfp4) pack_fp4(codes.data(), static_cast<int64_t>(codes.size()), c.row.data());
    else pack_fp6(codes.data(), static_cast<int64_t>(codes.size()), c.row.data());
    v.push_back(c);
  }
  {  // NVFP4: every code, several fp8 block scales incl. subnormal ones, K % 32 == 16
    DecodeCase c{"nvfp4", WeightFormat::Nvfp4, DType::U8, 16 * 7, {}, {}, 0.00317f, {}};
    const uint8_t fs[] = {0x01, 0x07, 0x08, 0x38, 0x55, 0x7E, 0xB9};
    std::vector<uint8_t> codes;
    for (int b = 0; b < 7; ++b) {
      c.scales.push_back(fs[b]);
      const float factor = fp8_e4m3_decode(fs[b]) * c.nv_global;
      for (int j = 0; j < 16; ++j) {
        const uint8_t code = static_cast<uint8_t>((j + b) % 16);
        codes.push_back(code);
        c.want.push_back(fp4_e2m1_decode(code) * factor);
      }
    }
    c.row.resize(codes.size() / 2);
    pack_fp4(codes.data(), static_cast<int64_t>(codes.size()), c.row.data());
    v.push_back(c);
  }
  return v;
}

TEST(OptimizedUnits, WeightDecodeMatchesFormats) {
  for (const DecodeCase& c : decode_cases()) {
    WeightView w;
    w.fmt = c.fmt;
    w.dtype = c.dtype;
    w.rows = 1;
    w.cols = c.K;
    w.row_bytes = static_cast<int64_t>(c.row.size());
    w.data = c.row.data();
    w.scales = c.scales.empty() ? nullptr : c.scales.data();
    w.nv_global = c.nv_global;
    for (DotKind kind : {DotKind::F32, DotKind::Bf16}) {
    if (kind == DotKind::Bf16 && !(is_mx_weight(c.fmt) || c.dtype == DType::BF16 || c.fmt == WeightFormat::Fp8E4M3)) continue;
    const ActLayout layout = make_act_layout(kind, c.fmt, c.K);
    // Act rows: e_j (value 1 at j's stored position), row scale 1.
    std::vector<uint8_t> act(static_cast<size_t>(layout.stride * c.K), 0);
    std::vector<int32_t> index(static_cast<size_t>(c.K));
    for (int j = 0; j < c.K; ++j) {
      uint8_t* row = act.data() + static_cast<int64_t>(j) * layout.stride;
      const float one = 1.0f;
      std::memcpy(row, &one, 4);
      if (kind == DotKind::Bf16) {
        const int32_t nt = 1;
        const uint16_t one_bf16 = 0x3F80;
        std::memcpy(row + 8, &nt, 4);
        std::memcpy(row + layout.vals_off + 2 * act_value_position(layout, j), &one_bf16, 2);
      } else {
        std::memcpy(row + layout.vals_off + 4 * act_value_position(layout, j), &one, 4);
      }
      index[static_cast<size_t>(j)] = j;
    }
    for (Isa isa : isas()) {
      if (!implements(isa, kind)) continue;
      for (int ntok : {1, c.K}) {  // fused decode (≤ 4 tokens) and the decoded-tile path
        std::vector<float> out(static_cast<size_t>(c.K), -7.0f);
        kernel_table(isa).gemm(gemm_args(w, layout, act.data(), index.data(), ntok, 0, 1, out.data(), 1));
        for (int j = 0; j < ntok; ++j)
          ASSERT_EQ(out[static_cast<size_t>(j)], c.want[static_cast<size_t>(j)])
              << c.name << " kind " << static_cast<int>(kind) << " isa " << isa_name(isa) << " element " << j
              << " ntok " << ntok;
      }
    }
    }
  }
}

// Integer kinds (and F32 with several rows / tokens / tails) against the scalar kernel.
TEST(OptimizedUnits, GemmKindsMatchScalar) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd;
  struct K {
    DotKind kind;
    WeightFormat fmt;
    ActQuant act;
    int k;
  };
  // (amx: K = 256 / 192 read whole 32-row panels of int8 / bf16 weights in place; the other K a
  // zero-padded copy.)
  const std::vector<K> kinds = {{DotKind::I8, WeightFormat::Int8, ActQuant::Int8DynToken, 200},
                                {DotKind::I8, WeightFormat::Int8, ActQuant::Int8DynToken, 256},
                                {DotKind::I8, WeightFormat::Int8, ActQuant::Int8Static, 64},
                                {DotKind::Fp4Mx, WeightFormat::Mxfp4, ActQuant::Mxfp4, 96},
                                {DotKind::Fp4Mx, WeightFormat::Mxfp4, ActQuant::Mxfp4, 256},
                                // W4A6: 8·e2m3 activation values (|·| ≤ 60) on the same kernels
                                {DotKind::Fp4Mx, WeightFormat::Mxfp4, ActQuant::Mxfp6E2M3, 96},
                                {DotKind::Fp4Mx, WeightFormat::Mxfp4, ActQuant::Mxfp6E2M3, 2112},
                                // W6A6 E2M3 (AVX2's w6_weights): whole 64-chunks, a last half chunk
                                // (K = 160: the zero-padded copy), and K = 2112
                                {DotKind::Fp4Mx, WeightFormat::Mxfp6E2M3, ActQuant::Mxfp6E2M3, 128},
                                {DotKind::Fp4Mx, WeightFormat::Mxfp6E2M3, ActQuant::Mxfp6E2M3, 160},
                                {DotKind::Fp4Mx, WeightFormat::Mxfp6E2M3, ActQuant::Mxfp6E2M3, 2112},
                                {DotKind::Fp4Nv, WeightFormat::Nvfp4, ActQuant::Nvfp4, 80},
                                {DotKind::Fp4Nv, WeightFormat::Nvfp4, ActQuant::Nvfp4, 128},
                                // 66 NVFP4 blocks per row: two 32-code runs of AVX2's vector
                                // factor path (w4_nv_factors) and a table tail
                                {DotKind::Fp4Nv, WeightFormat::Nvfp4, ActQuant::Nvfp4, 1056},
                                {DotKind::F32, WeightFormat::Fp8E4M3, ActQuant::Fp8DynToken, 70},
                                {DotKind::F32, WeightFormat::Mxfp6E3M2, ActQuant::Mxfp6E3M2, 64},
                                {DotKind::F32, WeightFormat::Mxfp4, ActQuant::None, 96},
                                {DotKind::F32, WeightFormat::Mxfp4, ActQuant::None, 256},
                                // AVX-512's one-row kernel reads 128-weight chunks: a last chunk of
                                // 32 / 64 weights (96 above: 96)
                                {DotKind::F32, WeightFormat::Mxfp4, ActQuant::None, 160},
                                {DotKind::F32, WeightFormat::Mxfp4, ActQuant::None, 320},
                                {DotKind::F32, WeightFormat::BF16, ActQuant::None, 72},
                                {DotKind::F32, WeightFormat::BF16, ActQuant::None, 200},
                                {DotKind::Bf16, WeightFormat::Mxfp4, ActQuant::None, 96},
                                {DotKind::Bf16, WeightFormat::Mxfp4, ActQuant::Mxfp6E2M3, 128},
                                {DotKind::Bf16, WeightFormat::Mxfp6E2M3, ActQuant::None, 96},
                                {DotKind::Bf16, WeightFormat::Mxfp6E3M2, ActQuant::Fp8DynToken, 64},
                                {DotKind::Bf16, WeightFormat::BF16, ActQuant::None, 72},
                                {DotKind::Bf16, WeightFormat::BF16, ActQuant::None, 200},
                                {DotKind::Bf16, WeightFormat::BF16, ActQuant::None, 192},
                                {DotKind::Bf16, WeightFormat::Fp8E4M3, ActQuant::Fp8DynToken, 70},
                                {DotKind::Bf16, WeightFormat::Nvfp4, ActQuant::Nvfp4, 128},
                                {DotKind::Bf16, WeightFormat::Nvfp4, ActQuant::Nvfp4, 96},
                                {DotKind::Bf16, WeightFormat::Fp8E4M3, ActQuant::Fp8Static, 128},
                                // amx: K past one ring chunk (gemm_amx.cc ring_blocks: 8 blocks of 32
                                // for MXFP4, 16 otherwise), so the ring wraps and its last chunk is partial
                                {DotKind::Bf16, WeightFormat::Mxfp4, ActQuant::None, 608},
                                // MXFP4's panel fill (prep_mx4; 608 above: its half last step):
                                // a wrapping ring with a partial last chunk, and 20 / 66 block
                                // scales per row (row_deltas' masked tail)
                                {DotKind::Bf16, WeightFormat::Mxfp4, ActQuant::None, 640},
                                {DotKind::Bf16, WeightFormat::Mxfp4, ActQuant::Mxfp4, 2112},
                                {DotKind::Bf16, WeightFormat::Fp8E4M3, ActQuant::Fp8DynToken, 1064},
                                {DotKind::Bf16, WeightFormat::Mxfp6E2M3, ActQuant::None, 544},
                                {DotKind::Bf16, WeightFormat::Nvfp4, ActQuant::Nvfp4, 1120},
                                {DotKind::Bf16, WeightFormat::BF16, ActQuant::None, 1000}};
  for (const K& kc : kinds) {
    // rows 1..38: two 16-row tiles + a remainder; up to 131 tokens: past the AVX2 W4A16 token tile (128)
    const int rows = 39, ntok = 131, k = kc.k;
    const bool bf16w = kc.fmt == WeightFormat::BF16;
    const int64_t pcols = kc.fmt == WeightFormat::Mxfp4 || kc.fmt == WeightFormat::Nvfp4 ? k / 2
                          : is_mx_weight(kc.fmt)                                        ? k * 3 / 4
                          : bf16w                                                       ? 2 * k
                                                                                        : k;
    std::vector<uint8_t> wbytes(static_cast<size_t>(rows * pcols));
    for (auto& b : wbytes) {
      b = static_cast<uint8_t>(byte(rng));
      if (kc.fmt == WeightFormat::Fp8E4M3 && (b & 0x7F) == 0x7F) b = 0x11;
    }
    if (bf16w)
      for (int64_t i = 0; i < rows * k; ++i) {
        const uint16_t h = bf16_encode(nd(rng) * 0.3f);
        std::memcpy(wbytes.data() + 2 * i, &h, 2);
      }
    const int bs = weight_block_size(kc.fmt);
    std::vector<uint8_t> sc(bs ? static_cast<size_t>(rows * (k / bs)) : 0);
    // MXFP4 on the F32 kind (fp32 products and sums, in another order than the scalar kernel's):
    // weights ≤ 6 · 2^-4, so the fp32 rounding of Σ w·x (∝ Σ |w·x|) stays under the absolute floor
    // of the bound below; at 120 … 131 both the fp32-decode and the bf16-table AVX2 paths exceed it.
    const int sbase = kc.kind == DotKind::F32 && kc.fmt == WeightFormat::Mxfp4 ? 112 : 120;
    for (auto& s : sc) s = kc.fmt == WeightFormat::Nvfp4 ? fp8_e4m3_encode(1.0f + 100.0f * std::fabs(nd(rng))) : static_cast<uint8_t>(sbase + byte(rng) % 12);
    if (kc.kind == DotKind::Bf16 && bs > 0) {  // row 5: scale bytes outside the bf16 window (scalar fallback)
      sc[static_cast<size_t>(5 * (k / bs))] = 0;
      sc[static_cast<size_t>(5 * (k / bs) + 1)] = 1;
    }
    if (kc.fmt == WeightFormat::Mxfp4) {  // row 7: the E8M0 bytes 0 (2^-127) and 1 (AVX2 builds 2^(s-127) from bits)
      sc[static_cast<size_t>(7 * (k / bs))] = 0;
      sc[static_cast<size_t>(7 * (k / bs) + 1)] = 1;
    }
    std::vector<float> chan(static_cast<size_t>(rows)), bias(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      chan[static_cast<size_t>(r)] = 0.01f + 0.001f * r;
      bias[static_cast<size_t>(r)] = nd(rng);
    }
    WeightView w;
    w.fmt = kc.fmt;
    w.dtype = bf16w ? DType::BF16 : DType::U8;
    w.rows = rows;
    w.cols = k;
    w.row_bytes = pcols;
    w.data = wbytes.data();
    w.scales = sc.empty() ? nullptr : sc.data();
    w.channel_scale = bs ? nullptr : chan.data();
    w.nv_global = 0.0021f;
    w.bias = bias.data();
    ref::ActQuantRule rule;
    rule.kind = kc.act;
    rule.static_scale = kc.act == ActQuant::Nvfp4 ? 500.0f : 0.05f;
    const ActLayout layout = make_act_layout(kc.kind, kc.fmt, k);
    std::vector<uint8_t> act(static_cast<size_t>(layout.stride * ntok));
    std::vector<int32_t> index(ntok);
    std::vector<float> post(ntok);
    // The same rows with every weight and activation made non-negative: the scalar kernel on them
    // gives Σ |w·x| per output, the scale of the fp32 rounding of a sum taken in another order
    // (F32 and Bf16 kinds; the order inside a vdpbf16ps pair is the CPU's own, AMD Zen 4 rounding
    // differently from Zen 5 and Intel).
    std::vector<uint8_t> act_abs(act.size());
    for (int t = 0; t < ntok; ++t) {
      std::vector<float> x(static_cast<size_t>(k));
      for (float& v : x) v = nd(rng);
      QuantRowArgs q{&rule, &layout, 0.0f, x.data(), act.data() + static_cast<int64_t>(t) * layout.stride};
      quantize_row_scalar(q);
      for (float& v : x) v = std::fabs(v);  // the quantizers are symmetric: |q(x)| = q(|x|)
      QuantRowArgs qa{&rule, &layout, 0.0f, x.data(), act_abs.data() + static_cast<int64_t>(t) * layout.stride};
      quantize_row_scalar(qa);
      index[static_cast<size_t>(t)] = ntok - 1 - t;
      post[static_cast<size_t>(t)] = 0.5f + 0.1f * (t % 11);  // ≤ 1.5: the bound's absolute floor is not scaled
    }
    std::vector<uint8_t> wabs = wbytes;
    if (bf16w)
      for (size_t i = 1; i < wabs.size(); i += 2) wabs[i] &= 0x7F;
    else if (kc.fmt == WeightFormat::Fp8E4M3)
      for (auto& b : wabs) b &= 0x7F;
    else if (kc.fmt == WeightFormat::Mxfp4 || kc.fmt == WeightFormat::Nvfp4)
      for (auto& b : wabs) b &= 0x77;
    else if (is_mx_weight(kc.fmt))
      for (int r = 0; r < rows; ++r) {
        std::vector<uint8_t> codes(static_cast<size_t>(k));
        unpack_fp6(wabs.data() + r * pcols, k, codes.data());
        for (auto& c : codes) c &= 0x1F;
        pack_fp6(codes.data(), k, wabs.data() + r * pcols);
      }
    WeightView wa = w;
    wa.data = wabs.data();
    std::vector<float> bias_abs(bias.size());
    for (size_t i = 0; i < bias.size(); ++i) bias_abs[i] = std::fabs(bias[i]);
    wa.bias = bias_abs.data();
    auto run = [&](Isa isa, int nt, bool magnitude = false) {
      std::vector<float> out(static_cast<size_t>(ntok * rows), 0.0f);
      GemmArgs g = gemm_args(magnitude ? wa : w, layout, magnitude ? act_abs.data() : act.data(), index.data(), nt, 1, rows,
                             out.data(), rows);
      g.post_mul = post.data();
      kernel_table(isa).gemm(g);
      return out;
    };
    // 5 and 9: uneven token groups (token_group: 3 + 2, 3 + 3 + 3 on AVX2); amx: 11 and 27 one pass
    // (the ring), ntok several.
    for (int nt : {1, 2, 3, 5, 9, 11, 27, ntok}) {
      const std::vector<float> want = run(Isa::Scalar, nt);
      const std::vector<float> mag = run(Isa::Scalar, nt, /*magnitude=*/true);
      for (Isa isa : isas()) {
        if (isa == Isa::Scalar || !implements(isa, kc.kind)) continue;
        const std::vector<float> got = run(isa, nt);
        for (size_t i = 0; i < got.size(); ++i) {
          if (kc.kind == DotKind::I8) {
            ASSERT_EQ(got[i], want[i]) << "I8 is exact; isa " << isa_name(isa) << " i " << i;  // exact int32 dot
          } else {
            // 2e-6 relative (the output's own rounding and the scales' products), plus 4·√n fp32
            // units of Σ |w·x| for a sum of n terms in another order: n = k for the fp32-sum kinds;
            // the Fp4 kinds sum exact block dot products, n = k / block of them (NVFP4 at k = 1056,
            // 66 blocks: 4e-6 relative apart, where the 2e-6 alone had held to 16 blocks).
            const bool fp4 = kc.kind == DotKind::Fp4Mx || kc.kind == DotKind::Fp4Nv;
            const double n_terms = fp4 ? static_cast<double>(k) / (kc.kind == DotKind::Fp4Mx ? 32 : 16) : static_cast<double>(k);
            const double order = 4.0 * std::sqrt(n_terms) * 0x1p-24 * std::fabs(mag[i]);
            ASSERT_NEAR(got[i], want[i], 2e-6 * (std::fabs(want[i]) + 1.0) + order)
                << static_cast<int>(kc.kind) << " " << to_string(kc.fmt) << " k " << k << " ntok " << nt << " isa "
                << isa_name(isa) << " i " << i;
          }
        }
        EXPECT_EQ(got[0], 0.0f);  // row 0 not in [row0, row1): untouched
      }
    }
  }
}

// MXFP4 W4A4 weight factors: the targets that build 2^(s−127) from the E8M0 bits (AVX2
// kW4ScaleBits) do so only for row blocks whose bytes are all 1…254; a block holding a 0 (2^−127,
// subnormal) or a 255 (NaN) takes the table. Rows 0–3: ordinary bytes; row 5: every byte 0 with no
// bias, so its outputs are ~1e-36, which the bit form would make 0 (and the general test's absolute
// tolerance cannot see); row 9: one 255, so its outputs are NaN (the bit form gives ±Inf).
TEST(OptimizedUnits, W4a4MxFactorsFromScaleBitsOnlyForOrdinaryBytes) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int rows = 12, k = 192, nb = k / 32, ntok = 5;
  std::vector<uint8_t> wbytes(static_cast<size_t>(rows * k / 2)), sc(static_cast<size_t>(rows * nb));
  for (auto& b : wbytes) b = static_cast<uint8_t>(rng());
  for (auto& s : sc) s = static_cast<uint8_t>(118 + rng() % 16);
  for (int b = 0; b < nb; ++b) sc[static_cast<size_t>(5 * nb + b)] = 0;
  sc[static_cast<size_t>(9 * nb + 2)] = 255;
  // Row 9's codes and every activation positive: each lane of its NaN block has a positive sum, so
  // a factor of +Inf there would give +Inf, not the NaN the table gives.
  for (int j = 0; j < k / 2; ++j) {
    uint8_t& b = wbytes[static_cast<size_t>(9 * k / 2 + j)];
    b = static_cast<uint8_t>((b & 0x77) | 0x11);
  }
  WeightView w;
  w.fmt = WeightFormat::Mxfp4;
  w.dtype = DType::U8;
  w.rows = rows;
  w.cols = k;
  w.row_bytes = k / 2;
  w.data = wbytes.data();
  w.scales = sc.data();
  ref::ActQuantRule rule;
  rule.kind = ActQuant::Mxfp4;
  const ActLayout layout = make_act_layout(DotKind::Fp4Mx, WeightFormat::Mxfp4, k);
  std::vector<uint8_t> act(static_cast<size_t>(layout.stride * ntok));
  std::vector<int32_t> index(ntok);
  for (int t = 0; t < ntok; ++t) {
    std::vector<float> x(static_cast<size_t>(k));
    for (float& v : x) v = 0.1f + std::fabs(nd(rng));
    QuantRowArgs q{&rule, &layout, 0.0f, x.data(), act.data() + static_cast<int64_t>(t) * layout.stride};
    quantize_row_scalar(q);
    index[static_cast<size_t>(t)] = t;
  }
  auto run = [&](Isa isa, int nt) {
    std::vector<float> out(static_cast<size_t>(nt * rows), 0.0f);
    kernel_table(isa).gemm(gemm_args(w, layout, act.data(), index.data(), nt, 0, rows, out.data(), rows));
    return out;
  };
  for (int nt : {1, 2, ntok}) {
    const std::vector<float> want = run(Isa::Scalar, nt);
    for (int t = 0; t < nt; ++t) {
      ASSERT_TRUE(std::isnan(want[static_cast<size_t>(t * rows + 9)])) << "row 9 (a NaN scale) t " << t;
      const float tiny = want[static_cast<size_t>(t * rows + 5)];
      ASSERT_TRUE(tiny != 0.0f && std::fabs(tiny) < 1e-30f) << "row 5 (2^-127 scales) t " << t << ": " << tiny;
    }
    for (Isa isa : isas()) {
      if (isa == Isa::Scalar || !implements(isa, DotKind::Fp4Mx)) continue;
      const std::vector<float> got = run(isa, nt);
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << "isa " << isa_name(isa) << " ntok " << nt << " i " << i << ": " << got[i];
        } else {
          // Exact block sums times powers of two: the same value up to the fp32 sum order.
          EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << "isa " << isa_name(isa) << " ntok " << nt << " i " << i;
        }
      }
    }
  }
}

// fp8_e4m3_round (the NVFP4 quantizers' block-scale rounding, by bit operations) equals the codec,
// fp8_e4m3_decode(fp8_e4m3_encode(v)), bit for bit: every float of the binades where the e4m3 grid
// changes (2^-10 … 2^-5: subnormals to normals; 2^8, 2^9: saturation at 448), the ties of the 3-bit
// grid and their neighbours in every binade from 2^-9 to 2^10, a sample of all floats, ±0, ±Inf,
// NaN and fp32 subnormals — both signs.
TEST(OptimizedUnits, E4m3RoundMatchesTheCodec) {
  auto check = [](uint32_t bits) {
    float v;
    std::memcpy(&v, &bits, 4);
    const float got = fp8_e4m3_round(v), want = fp8_e4m3_decode(fp8_e4m3_encode(v));
    uint32_t g, w;
    std::memcpy(&g, &got, 4);
    std::memcpy(&w, &want, 4);
    if (std::isnan(want)) return std::isnan(got);
    return g == w;
  };
  int64_t n = 0, bad = 0;
  auto run = [&](uint32_t bits) {
    ++n;
    if (!check(bits) && bad++ < 5) ADD_FAILURE() << "bits 0x" << std::hex << bits;
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (int e : {-10, -9, -8, -7, -6, -5, 8, 9})  // every fraction
      for (uint32_t f = 0; f < (1u << 23); f += sign ? 7u : 1u) run(sign | (static_cast<uint32_t>(e + 127) << 23) | f);
    for (int e = -9; e <= 10; ++e)  // ties of the 3-bit grid and their neighbours, every high fraction
      for (uint32_t hi = 0; hi < 8; ++hi)
        for (uint32_t d : {0x7FFFFu, 0x80000u, 0x80001u, 0xFFFFFu, 0u, 1u})
          run(sign | (static_cast<uint32_t>(e + 127) << 23) | (hi << 20) | d);
    for (uint32_t x = 0; x < 0x7F800000u; x += 4099u) run(sign | x);  // a sample of everything
    for (uint32_t x : {0u, 1u, 0x7FFFFFu, 0x800000u, 0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u, 0x7F800001u}) run(sign | x);
  }
  EXPECT_EQ(bad, 0) << "of " << n;
}

// Gated activations: within 1 ulp of the reference (which rounds a double result once).
TEST(OptimizedUnits, ActivationsMatchReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<ActivationSpec> specs(5);
  specs[1].limit = 7.0f;
  specs[2].kind = Activation::GeluTanh;
  specs[3].kind = Activation::SwigluOai;
  specs[3].interleaved = true;
  specs[3].limit = 7.0f;
  specs[4].kind = Activation::Gelu;
  const int I = 77;
  for (const auto& spec : specs) {
    for (float mag : {1.0f, 10.0f, 1000.0f}) {
      std::vector<float> y(2 * I);
      for (float& v : y) v = nd(rng) * mag;
      y[0] = 0.0f;
      y[3] = -800.0f;
      y[5] = 800.0f;
      std::vector<float> want(I);
      ref::apply_activation_row(spec, y.data(), I, want.data());
      const ActParams ap = act_params_of(spec);
      for (Isa isa : isas()) {
        std::vector<float> got(I + 1, 123.0f);
        kernel_table(isa).activation_row(ap, y.data(), I, got.data());
        EXPECT_EQ(got[I], 123.0f) << "wrote past the end";
        for (int j = 0; j < I; ++j) {
          const float a = got[static_cast<size_t>(j)], b = want[static_cast<size_t>(j)];
          double tol = std::fabs(std::nextafter(b, INFINITY) - b);
          if (spec.kind == Activation::GeluTanh) {
            // The reference's 1 + tanh(z) cancels for z ≪ 0: its own absolute error is up to
            // ~ulp(1) = 2^-52 of 0.5·g·u, which no other evaluation reproduces bit for bit.
            const double g = y[static_cast<size_t>(j)], u = y[static_cast<size_t>(I + j)];
            tol += 0.5 * std::fabs(g * u) * std::ldexp(1.0, -51);
          }
          ASSERT_LE(std::fabs(a - b), tol) << to_string(spec.kind) << " isa " << isa_name(isa) << " j " << j << " g "
                                           << y[static_cast<size_t>(j)];
        }
      }
    }
  }
}

// The dot-product kind is a speed choice (dot_kind_for): MXFP4 W4A4 keeps its exact integer
// block sums at decode and takes the Bf16 kind from w4a4_bf16_tokens() tokens per expert, on
// avx512bf16 only (kW4a4Bf16Tokens; never on Zen 4's half-width AVX-512); NVFP4 W4A4 and INT8
// W8A8 keep their integer kinds at every token count.
TEST(OptimizedUnits, DotKindFollowsTokensPerExpert) {
  const SchemeInfo& mx = scheme_by_name("w_mxfp4_a_mxfp4");
  const SchemeInfo& nv = scheme_by_name("nvfp4");
  const SchemeInfo& i8 = scheme_by_name("w_int8_channel_a_int8_dyn_token");
  // MXFP4 weights with MXFP6 E2M3 activations (W4A6) take W4A4's kinds at every point: the same
  // integer kernels (8·e2m3 values in the int8 row).
  const SchemeInfo& w4a6 = scheme_by_name("w_mxfp4_a_mxfp6_e2m3");
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx})
    for (int gemm : {1, 2})
      for (double tpe : {0.1, 1.0, 3.0, 4.0, kAmxW4a4Bf16Tokens, kW4a4Bf16Tokens, 16.0, 128.0})
        EXPECT_EQ(dot_kind_for(mx, isa, gemm, DType::BF16, tpe), dot_kind_for(w4a6, isa, gemm, DType::BF16, tpe))
            << isa_name(isa) << " " << gemm << " " << tpe;
  EXPECT_EQ(DotKind::F32, dot_kind_for(scheme_by_name("w_mxfp4_a_mxfp6_e3m2"), Isa::Avx2, 1, DType::BF16, 1.0));
  // MXFP6 E2M3 W6A6: the integer kind on AVX2 only (its 6-bit decoder), below kAvx2W6a6IntTokens.
  const SchemeInfo& w6a6 = scheme_by_name("w_mxfp6_e2m3_a_mxfp6_e2m3");
  for (int gemm : {1, 2})
    for (double tpe : {0.1, 1.0, 8.0, kAvx2W6a6IntTokens - 0.5, kAvx2W6a6IntTokens, 128.0}) {
      EXPECT_EQ(tpe < kAvx2W6a6IntTokens ? DotKind::Fp4Mx : DotKind::F32, dot_kind_for(w6a6, Isa::Avx2, gemm, DType::BF16, tpe))
          << gemm << " " << tpe;
      EXPECT_EQ(DotKind::F32, dot_kind_for(w6a6, Isa::Scalar, gemm, DType::BF16, tpe)) << gemm << " " << tpe;
      EXPECT_NE(DotKind::Fp4Mx, dot_kind_for(w6a6, Isa::Avx512, gemm, DType::BF16, tpe)) << gemm << " " << tpe;
    }
  const double from = w4a4_bf16_tokens();
  EXPECT_EQ(from, cpu_features().avx512_half_width ? std::numeric_limits<double>::infinity() : kW4a4Bf16Tokens);
  for (int gemm : {1, 2}) {
    for (double tpe : {0.1, 1.0, 4.0, kW4a4Bf16Tokens - 0.5}) {
      EXPECT_EQ(DotKind::Fp4Mx, dot_kind_for(mx, Isa::Avx512Bf16, gemm, DType::BF16, tpe)) << tpe;
    }
    for (double tpe : {kW4a4Bf16Tokens, 16.0, 128.0}) {
      EXPECT_EQ(tpe >= from ? DotKind::Bf16 : DotKind::Fp4Mx, dot_kind_for(mx, Isa::Avx512Bf16, gemm, DType::BF16, tpe)) << tpe;
      for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
        EXPECT_EQ(DotKind::Fp4Mx, dot_kind_for(mx, isa, gemm, DType::BF16, tpe)) << isa_name(isa);
      EXPECT_EQ(DotKind::Fp4Nv, dot_kind_for(nv, Isa::Avx512Bf16, gemm, DType::BF16, tpe));
      EXPECT_EQ(DotKind::I8, dot_kind_for(i8, Isa::Avx512Bf16, gemm, DType::BF16, tpe));
    }
  }
  // amx: from kAmxBf16Tokens every bf16-exact weight format takes Bf16 (AMX tiles), the
  // unquantized intermediate of GEMM2 too; below, avx512bf16's choices.
  const SchemeInfo& bf = scheme_by_name("unquantized");
  const SchemeInfo& w4 = scheme_by_name("w_mxfp4");
  for (double tpe : {kAmxBf16Tokens, kW4a4Bf16Tokens, 64.0}) {
    for (int gemm : {1, 2}) {
      EXPECT_EQ(DotKind::Bf16, dot_kind_for(bf, Isa::Amx, gemm, DType::BF16, tpe)) << gemm;
      EXPECT_EQ(DotKind::Bf16, dot_kind_for(w4, Isa::Amx, gemm, DType::BF16, tpe)) << gemm;
      // (MXFP4 W4A4 keeps its integer kind below kAmxW4a4Bf16Tokens on amx.)
      EXPECT_EQ(tpe >= kAmxW4a4Bf16Tokens ? DotKind::Bf16 : DotKind::Fp4Mx, dot_kind_for(mx, Isa::Amx, gemm, DType::BF16, tpe)) << gemm;
      EXPECT_EQ(tpe >= kAmxNvfp4Bf16Tokens ? DotKind::Bf16 : DotKind::Fp4Nv, dot_kind_for(nv, Isa::Amx, gemm, DType::BF16, tpe)) << gemm;
      EXPECT_EQ(DotKind::I8, dot_kind_for(i8, Isa::Amx, gemm, DType::BF16, tpe)) << gemm;
      EXPECT_EQ(DotKind::F32, dot_kind_for(bf, Isa::Amx, gemm, DType::F32, tpe)) << gemm;  // fp32 storage
    }
  }
  // Below every amx threshold: avx512bf16's choices, except MXFP4 / FP8 weights with non-MXFP4
  // activations, which take the fp32 FMA kind there (faster on Intel's cores than vdpbf16ps).
  const SchemeInfo& f8 = scheme_by_name("w_fp8_channel_a_fp8_dyn_token");
  const SchemeInfo& w6 = scheme_by_name("w_mxfp6_e2m3");
  const SchemeInfo& w4a8 = scheme_by_name("w_mxfp4_a_fp8");
  for (double tpe : {0.5, kAmxMxfp4Bf16Tokens - 0.5})
    for (int gemm : {1, 2}) {
      for (const SchemeInfo* s : {&bf, &mx, &nv, &i8, &w6})
        EXPECT_EQ(dot_kind_for(*s, Isa::Avx512Bf16, gemm, DType::BF16, tpe), dot_kind_for(*s, Isa::Amx, gemm, DType::BF16, tpe))
            << s->name << " " << gemm << " " << tpe;
      for (const SchemeInfo* s : {&w4, &w4a8, &f8}) EXPECT_EQ(DotKind::F32, dot_kind_for(*s, Isa::Amx, gemm, DType::BF16, tpe)) << s->name << " " << gemm << " " << tpe;
    }
  // MXFP4 / FP8 weights on one-term inputs take the tiles from kAmxMxfp4Bf16Tokens /
  // kAmxFp8Bf16Tokens; an unquantized intermediate (GEMM2 of a weight-only scheme, 3 terms) only
  // from kAmxBf16Tokens. MXFP4 W4A4 from kAmxW4a4Bf16Tokens.
  for (double tpe : {kAmxMxfp4Bf16Tokens, kAmxBf16Tokens - 0.5}) {
    EXPECT_EQ(DotKind::Bf16, dot_kind_for(w4, Isa::Amx, 1, DType::BF16, tpe)) << tpe;
    EXPECT_EQ(DotKind::F32, dot_kind_for(w4, Isa::Amx, 2, DType::BF16, tpe)) << tpe;
    for (int gemm : {1, 2}) EXPECT_EQ(DotKind::Bf16, dot_kind_for(w4a8, Isa::Amx, gemm, DType::BF16, tpe)) << gemm << " " << tpe;
  }
  for (int gemm : {1, 2}) {
    EXPECT_EQ(DotKind::F32, dot_kind_for(f8, Isa::Amx, gemm, DType::BF16, kAmxFp8Bf16Tokens - 0.5)) << gemm;
    EXPECT_EQ(DotKind::Bf16, dot_kind_for(f8, Isa::Amx, gemm, DType::BF16, kAmxFp8Bf16Tokens)) << gemm;
    EXPECT_EQ(DotKind::Fp4Mx, dot_kind_for(mx, Isa::Amx, gemm, DType::BF16, kAmxW4a4Bf16Tokens - 0.5)) << gemm;
    EXPECT_EQ(DotKind::Bf16, dot_kind_for(mx, Isa::Amx, gemm, DType::BF16, kAmxW4a4Bf16Tokens)) << gemm;
  }
}

TEST(OptimizedUnits, ThreadPoolCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    std::vector<std::atomic<int>> hits(1000);
    std::atomic<int> phase2{0};
    ThreadPool::instance().run(threads, [&](Team& team) {
      team.for_each(1000, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      team.for_each(7, [&](int64_t) { phase2.fetch_add(1); });
      team.for_each(0, [&](int64_t) { phase2.fetch_add(100); });
      team.for_each_on_caller(5, [&](int64_t) {
        EXPECT_EQ(team.id(), 0);
        phase2.fetch_add(10);
      });
      team.for_each(3, [&](int64_t) { phase2.fetch_add(1000); });
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    EXPECT_EQ(phase2.load(), 7 + 50 + 3000);
  }
  EXPECT_THROW(ThreadPool::instance().run(3, [](Team& team) {
    team.for_each(10, [](int64_t i) {
      if (i == 4) throw Error("boom");
    });
  }),
               Error);
  // Still usable after an exception; concurrent regions fall back to their callers.
  std::atomic<int> total{0};
  std::vector<std::thread> th;
  for (int c = 0; c < 4; ++c)
    th.emplace_back([&] {
      ThreadPool::instance().run(2, [&](Team& team) { team.for_each(100, [&](int64_t) { total.fetch_add(1); }); });
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(total.load(), 400);
}

// A helper joins every region however its worker was idle: spinning right after a region, woken
// ahead by prewake(), or asleep after its spin ran out. Each region's two indices wait for each
// other, so they only finish when a second member runs one of them.
TEST(OptimizedUnits, ThreadPoolHelpersJoinAfterSpinSleepAndPrewake) {
  if (ThreadPool::resolve_threads(2) < 2) GTEST_SKIP() << "one hardware thread";
  const auto spin = std::chrono::microseconds(ThreadPool::spin_micros());
  auto region_has_two_members = [] {
    std::atomic<int> started{0};
    std::atomic<bool> met{true};
    ThreadPool::instance().run(2, [&](Team& team) {
      team.for_each(2, [&](int64_t) {
        started.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (started.load() < 2) {
          if (std::chrono::steady_clock::now() > until) {
            met = false;
            return;
          }
          std::this_thread::yield();
        }
      });
    });
    return met.load();
  };
  EXPECT_TRUE(region_has_two_members()) << "first region";
  EXPECT_TRUE(region_has_two_members()) << "back to back (helper spinning)";
  std::this_thread::sleep_for(spin + std::chrono::milliseconds(20));
  EXPECT_TRUE(region_has_two_members()) << "after the spin ran out (helper asleep)";
  ThreadPool::instance().prewake(2);
  EXPECT_TRUE(region_has_two_members()) << "right after prewake";
  ThreadPool::instance().prewake(2);
  std::this_thread::sleep_for(spin + std::chrono::milliseconds(20));
  EXPECT_TRUE(region_has_two_members()) << "prewake, then the spin ran out";
  ThreadPool::instance().prewake(1);  // one thread: nothing to wake
  EXPECT_TRUE(region_has_two_members()) << "after prewake(1)";
}

// The CPUID / XGETBV reading (cpu_features) says what GCC's __builtin_cpu_supports says, feature by
// feature, on the machine the tests run on; the targets follow from the features.
TEST(OptimizedUnits, CpuFeaturesMatchTheCompilersView) {
  const CpuFeatures& f = cpu_features();
  std::printf("[ cpu      ] avx2 %d fma %d f16c %d avx512 f %d dq %d bw %d vl %d vnni %d bf16 %d amx tile %d bf16 %d int8 %d\n",
              f.avx2, f.fma, f.f16c, f.avx512f, f.avx512dq, f.avx512bw, f.avx512vl, f.avx512vnni, f.avx512bf16,
              f.amx_tile, f.amx_bf16, f.amx_int8);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  // __builtin_cpu_supports takes a string literal only, hence a macro rather than a table.
#define QMOE_EXPECT_FEATURE(field, name) EXPECT_EQ(f.field, !!__builtin_cpu_supports(name)) << name
  QMOE_EXPECT_FEATURE(avx2, "avx2");
  QMOE_EXPECT_FEATURE(fma, "fma");
  QMOE_EXPECT_FEATURE(f16c, "f16c");
  QMOE_EXPECT_FEATURE(avx512f, "avx512f");
  QMOE_EXPECT_FEATURE(avx512dq, "avx512dq");
  QMOE_EXPECT_FEATURE(avx512bw, "avx512bw");
  QMOE_EXPECT_FEATURE(avx512vl, "avx512vl");
  QMOE_EXPECT_FEATURE(avx512vnni, "avx512vnni");
  QMOE_EXPECT_FEATURE(avx512bf16, "avx512bf16");
  QMOE_EXPECT_FEATURE(amx_tile, "amx-tile");
  QMOE_EXPECT_FEATURE(amx_bf16, "amx-bf16");
  QMOE_EXPECT_FEATURE(amx_int8, "amx-int8");
#undef QMOE_EXPECT_FEATURE
#else
  GTEST_SKIP() << "no GCC __builtin_cpu_supports view to compare with";
#endif
  EXPECT_EQ(isa_supported(Isa::Avx2), f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(isa_supported(Isa::Avx512),
            isa_supported(Isa::Avx2) && f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl && f.avx512vnni);
  EXPECT_EQ(isa_supported(Isa::Avx512Bf16), isa_supported(Isa::Avx512) && f.avx512bf16);
  if (isa_supported(Isa::Amx)) {
    EXPECT_TRUE(f.amx_tile && f.amx_bf16 && f.amx_int8);
  }
}

}  // namespace
}  // namespace qmoe::cpu
