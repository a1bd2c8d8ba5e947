#include "params_builder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/ref/ref_ops.h"
#include "qmoe/formats.h"

namespace qmoe::cuda::test {

namespace {

MxElem mx_elem(WeightFormat f) {
  return f == WeightFormat::Mxfp4 ? MxElem::Fp4E2M1 : f == WeightFormat::Mxfp6E2M3 ? MxElem::Fp6E2M3 : MxElem::Fp6E3M2;
}

float absmax(const float* v, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

// Quantize master [E_loc][rows][cols] into the scheme's processed tensors.
void quantize_proj(const SchemeInfo& s, const std::vector<float>& m, int E_loc, int rows, int cols, Tensor& w,
                   Tensor& scale, Tensor& scale2) {
  const int64_t pc = weight_packed_cols(s.weight, cols);
  const int64_t per_e = int64_t{rows} * cols;
  switch (s.weight) {
    case WeightFormat::BF16: {
      w = Tensor::zeros(DType::BF16, {E_loc, rows, cols});
      uint16_t* d = w.mutable_data_as<uint16_t>();
      for (size_t i = 0; i < m.size(); ++i) d[i] = bf16_encode(m[i]);
      break;
    }
    case WeightFormat::Fp8E4M3:
    case WeightFormat::Int8: {
      const bool i8 = s.weight == WeightFormat::Int8;
      w = Tensor::zeros(i8 ? DType::I8 : DType::U8, {E_loc, rows, cols});
      const bool per_tensor = s.weight_scale == WeightScale::PerTensor;
      scale = per_tensor ? Tensor::zeros(DType::F32, {E_loc}) : Tensor::zeros(DType::F32, {E_loc, rows});
      float* sc = scale.mutable_data_as<float>();
      for (int e = 0; e < E_loc; ++e)
        for (int r = 0; r < rows; ++r) {
          const float* src = m.data() + e * per_e + int64_t{r} * cols;
          float sv;
          if (per_tensor) {
            if (r == 0) sc[e] = i8 ? int8_weight_scale(absmax(m.data() + e * per_e, per_e))
                                   : fp8_weight_scale(absmax(m.data() + e * per_e, per_e));
            sv = sc[e];
          } else {
            sv = sc[int64_t{e} * rows + r] = i8 ? int8_weight_scale(absmax(src, cols)) : fp8_weight_scale(absmax(src, cols));
          }
          for (int c = 0; c < cols; ++c) {
            const int64_t k = e * per_e + int64_t{r} * cols + c;
            if (i8) w.mutable_data_as<int8_t>()[k] = int8_quantize_weight(src[c], sv);
            else w.mutable_data_as<uint8_t>()[k] = fp8_quantize_weight(src[c], sv);
          }
        }
      break;
    }
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      w = Tensor::zeros(DType::U8, {E_loc, rows, pc});
      scale = Tensor::zeros(DType::U8, {E_loc, rows, cols / kMxBlock});
      const MxElem el = mx_elem(s.weight);
      std::vector<uint8_t> codes(static_cast<size_t>(cols));
      for (int e = 0; e < E_loc; ++e)
        for (int r = 0; r < rows; ++r) {
          const float* src = m.data() + e * per_e + int64_t{r} * cols;
          for (int b = 0; b < cols / kMxBlock; ++b) {
            const int sh = mx_quantize_block(src + b * kMxBlock, kMxBlock, el, MxScaleMode::Even, codes.data() + b * kMxBlock);
            scale.mutable_data_as<uint8_t>()[(int64_t{e} * rows + r) * (cols / kMxBlock) + b] = mx_scale_byte_quark(sh);
          }
          uint8_t* dst = w.mutable_data_as<uint8_t>() + (int64_t{e} * rows + r) * pc;
          if (s.weight == WeightFormat::Mxfp4) pack_fp4(codes.data(), cols, dst);
          else pack_fp6(codes.data(), cols, dst);
        }
      break;
    }
    case WeightFormat::Nvfp4: {
      w = Tensor::zeros(DType::U8, {E_loc, rows, pc});
      scale = Tensor::zeros(DType::U8, {E_loc, rows, cols / kNvfp4Block});
      scale2 = Tensor::zeros(DType::F32, {E_loc});
      std::vector<uint8_t> codes(static_cast<size_t>(cols));
      for (int e = 0; e < E_loc; ++e) {
        const float ws2 = nvfp4_global_scale(absmax(m.data() + e * per_e, per_e));
        scale2.mutable_data_as<float>()[e] = ws2;
        for (int r = 0; r < rows; ++r) {
          const float* src = m.data() + e * per_e + int64_t{r} * cols;
          for (int b = 0; b < cols / kNvfp4Block; ++b)
            scale.mutable_data_as<uint8_t>()[(int64_t{e} * rows + r) * (cols / kNvfp4Block) + b] =
                nvfp4_quantize_weight_block(src + b * kNvfp4Block, kNvfp4Block, ws2, codes.data() + b * kNvfp4Block);
          pack_fp4(codes.data(), cols, w.mutable_data_as<uint8_t>() + (int64_t{e} * rows + r) * pc);
        }
      }
      break;
    }
  }
}

}  // namespace

ExpertParams build_params(const BuildSpec& b, const std::vector<float>& x, int T) {
  const SchemeInfo& s = *b.scheme;
  ExpertParams p;
  p.scheme = &s;
  p.act = b.act;
  p.num_experts = b.E;
  p.hidden = b.H;
  p.inter = b.I;
  p.inter_full = b.I;
  if (b.expert_map.empty()) {
    p.expert_map.resize(static_cast<size_t>(b.E));
    std::iota(p.expert_map.begin(), p.expert_map.end(), 0);
  } else {
    p.expert_map = b.expert_map;
  }
  p.num_local = 0;
  for (int v : p.expert_map)
    if (v >= 0) ++p.num_local;
  for (int g = 0; g < b.E; ++g)
    if (p.expert_map[g] >= 0) p.local_to_global.push_back(g);
  const int E_loc = p.num_local, H = b.H, I = b.I;
  std::mt19937 rng(static_cast<uint32_t>(b.seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> m13(static_cast<size_t>(E_loc) * 2 * I * H), m2(static_cast<size_t>(E_loc) * H * I);
  for (auto& v : m13) v = nd(rng) / std::sqrt(static_cast<float>(H));
  for (auto& v : m2) v = nd(rng) / std::sqrt(static_cast<float>(I));
  quantize_proj(s, m13, E_loc, 2 * I, H, p.w13_weight, p.w13_weight_scale, p.w13_weight_scale_2);
  quantize_proj(s, m2, E_loc, H, I, p.w2_weight, p.w2_weight_scale, p.w2_weight_scale_2);
  if (b.bias) {
    std::vector<float> b13(static_cast<size_t>(E_loc) * 2 * I), b2(static_cast<size_t>(E_loc) * H);
    for (auto& v : b13) v = 0.1f * nd(rng);
    for (auto& v : b2) v = 0.1f * nd(rng);
    p.w13_bias = Tensor::from_f32(b13, {E_loc, 2 * I});
    p.w2_bias = Tensor::from_f32(b2, {E_loc, H});
  }
  // Static activation scales from the data: GEMM1 input amax, and the intermediate's amax from an
  // fp32 pass with exact weights and unquantized activations (an estimate; any positive value is valid).
  const float xmax = std::max(absmax(x.data(), static_cast<int64_t>(x.size())), 1e-3f);
  float zmax = 1e-3f;
  if (E_loc > 0) {
    p.processed = true;
    std::vector<float> w, bias, y1(static_cast<size_t>(2 * I)), z(static_cast<size_t>(I));
    for (int e = 0; e < std::min(E_loc, 4); ++e) {
      ref::decode_weight(p, ref::Proj::W13, e, w);
      ref::decode_bias(p, ref::Proj::W13, e, bias);
      for (int t = 0; t < std::min(T, 16); ++t) {
        for (int n = 0; n < 2 * I; ++n) {
          double acc = bias[static_cast<size_t>(n)];
          for (int h = 0; h < H; ++h) acc += static_cast<double>(w[static_cast<size_t>(n) * H + h]) * x[static_cast<size_t>(t) * H + h];
          y1[static_cast<size_t>(n)] = static_cast<float>(acc);
        }
        ref::apply_activation_row(p.act, y1.data(), I, z.data());
        zmax = std::max(zmax, absmax(z.data(), I));
      }
    }
  }
  switch (s.act) {
    case ActQuant::Fp8Static: p.a13_scale = xmax / 448.0f; p.a2_scale = zmax / 448.0f; break;
    case ActQuant::Int8Static: p.a13_scale = xmax / 127.0f; p.a2_scale = zmax / 127.0f; break;
    case ActQuant::Nvfp4: p.a13_scale = 1.0f / nvfp4_global_scale(xmax); p.a2_scale = 1.0f / nvfp4_global_scale(zmax); break;
    default: break;
  }
  p.processed = true;
  return p;
}

void random_routing(int T, int K, int E, std::mt19937& rng, std::vector<int32_t>& ids, std::vector<float>& w,
                    const std::vector<int>& allowed) {
  std::vector<int> pool = allowed;
  if (pool.empty()) {
    pool.resize(static_cast<size_t>(E));
    std::iota(pool.begin(), pool.end(), 0);
  }
  ids.assign(static_cast<size_t>(T) * K, 0);
  w.assign(static_cast<size_t>(T) * K, 0.0f);
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  for (int t = 0; t < T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      ids[static_cast<size_t>(t) * K + k] = pool[static_cast<size_t>(k) % pool.size()];
      sum += w[static_cast<size_t>(t) * K + k] = ud(rng);
    }
    for (int k = 0; k < K; ++k) w[static_cast<size_t>(t) * K + k] /= sum;
  }
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace qmoe::cuda::test
