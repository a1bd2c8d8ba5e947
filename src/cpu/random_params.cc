#include "cpu/random_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::cpu {

namespace {

// Small fast generator for benchmark-sized fills.
struct XorShift {
  uint64_t s;
  explicit XorShift(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normal() {  // sum of uniforms: cheap and bounded
    float a = 0.0f;
    for (int i = 0; i < 4; ++i) a += uniform();
    return (a - 2.0f) * 1.7320508f;
  }
};

MxElem mx_elem_of(WeightFormat f) {
  return f == WeightFormat::Mxfp4 ? MxElem::Fp4E2M1 : f == WeightFormat::Mxfp6E2M3 ? MxElem::Fp6E2M3 : MxElem::Fp6E3M2;
}

struct ProjOut {
  Tensor* weight;
  Tensor* scale;
  Tensor* scale2;
  Tensor* bias;
};

// Fills projection `rows × cols` of local expert e.
void fill_projection(const RandomExpertsSpec& spec, const SchemeInfo& s, int e, int rows, int cols, ProjOut o,
                     uint64_t seed) {
  const int64_t pc = weight_packed_cols(s.weight, cols);
  const float sigma = 1.0f / std::sqrt(static_cast<float>(cols));
  uint8_t* wbytes = reinterpret_cast<uint8_t*>(o.weight->mutable_data());
  const int64_t esz = s.weight == WeightFormat::BF16 ? dtype_bits(o.weight->dtype()) / 8 : 1;
  uint8_t* wrow0 = wbytes + static_cast<int64_t>(e) * rows * pc * esz;

  if (spec.fast) {
    XorShift rng(seed);
    const int64_t n = static_cast<int64_t>(rows) * pc;
    switch (s.weight) {
      case WeightFormat::BF16: {
        for (int64_t i = 0; i < static_cast<int64_t>(rows) * cols; ++i) {
          const float v = rng.normal() * sigma;
          if (o.weight->dtype() == DType::F32) reinterpret_cast<float*>(wrow0)[i] = bf16_round(v);
          else if (o.weight->dtype() == DType::BF16) reinterpret_cast<uint16_t*>(wrow0)[i] = bf16_encode(v);
          else reinterpret_cast<uint16_t*>(wrow0)[i] = fp16_encode(v);
        }
        break;
      }
      case WeightFormat::Fp8E4M3:
        for (int64_t i = 0; i < n; ++i) {
          uint8_t c = static_cast<uint8_t>(rng.next() >> 56);
          if ((c & 0x7F) >= 0x60) c = static_cast<uint8_t>(c & 0xBF);  // keep |v| ≲ 64 and off NaN
          wrow0[i] = c;
        }
        break;
      default:
        for (int64_t i = 0; i < n; i += 8) {
          const uint64_t r = rng.next();
          std::memcpy(wrow0 + i, &r, static_cast<size_t>(std::min<int64_t>(8, n - i)));
        }
        break;
    }
    switch (s.weight_scale) {
      case WeightScale::None: break;
      case WeightScale::PerTensor:
        o.scale->mutable_data_as<float>()[e] = sigma * (s.weight == WeightFormat::Int8 ? 1.0f / 64.0f : 1.0f / 16.0f);
        break;
      case WeightScale::PerChannel:
        for (int r = 0; r < rows; ++r)
          o.scale->mutable_data_as<float>()[static_cast<int64_t>(e) * rows + r] =
              sigma * (s.weight == WeightFormat::Int8 ? 1.0f / 64.0f : 1.0f / 16.0f) * (0.75f + 0.5f * rng.uniform());
        break;
      case WeightScale::MxE8M0: {
        const int nb = cols / kMxBlock;
        const int base = 127 + static_cast<int>(std::floor(std::log2(sigma / 2.5f)));
        uint8_t* sc = reinterpret_cast<uint8_t*>(o.scale->mutable_data()) + static_cast<int64_t>(e) * rows * nb;
        for (int64_t i = 0; i < static_cast<int64_t>(rows) * nb; ++i)
          sc[i] = static_cast<uint8_t>(base + static_cast<int>(rng.next() % 3) - 1);
        break;
      }
      case WeightScale::Nvfp4: {
        const int nb = cols / kNvfp4Block;
        uint8_t* sc = reinterpret_cast<uint8_t*>(o.scale->mutable_data()) + static_cast<int64_t>(e) * rows * nb;
        for (int64_t i = 0; i < static_cast<int64_t>(rows) * nb; ++i)
          sc[i] = fp8_e4m3_encode(64.0f + 192.0f * rng.uniform());
        o.scale2->mutable_data_as<float>()[e] = sigma / (2.5f * 160.0f);
        break;
      }
    }
  } else {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> w(static_cast<size_t>(rows) * cols);
    for (float& v : w) v = nd(rng);
    auto amax_of = [&](int64_t from, int64_t n) {
      float m = 0.0f;
      for (int64_t i = from; i < from + n; ++i) m = std::max(m, std::fabs(w[static_cast<size_t>(i)]));
      return m;
    };
    switch (s.weight) {
      case WeightFormat::BF16:
        for (size_t i = 0; i < w.size(); ++i) {
          if (o.weight->dtype() == DType::F32) reinterpret_cast<float*>(wrow0)[i] = bf16_round(w[i]);
          else if (o.weight->dtype() == DType::BF16) reinterpret_cast<uint16_t*>(wrow0)[i] = bf16_encode(w[i]);
          else reinterpret_cast<uint16_t*>(wrow0)[i] = fp16_encode(w[i]);
        }
        break;
      case WeightFormat::Fp8E4M3:
      case WeightFormat::Int8: {
        const bool fp8 = s.weight == WeightFormat::Fp8E4M3;
        const float tensor_amax = amax_of(0, static_cast<int64_t>(w.size()));
        for (int r = 0; r < rows; ++r) {
          const float amax = s.weight_scale == WeightScale::PerTensor ? tensor_amax : amax_of(static_cast<int64_t>(r) * cols, cols);
          const float scale = fp8 ? fp8_weight_scale(amax) : int8_weight_scale(amax);
          if (s.weight_scale == WeightScale::PerTensor) o.scale->mutable_data_as<float>()[e] = scale;
          else o.scale->mutable_data_as<float>()[static_cast<int64_t>(e) * rows + r] = scale;
          for (int c = 0; c < cols; ++c) {
            const float v = w[static_cast<size_t>(r) * cols + c];
            wrow0[static_cast<int64_t>(r) * cols + c] =
                fp8 ? fp8_quantize_weight(v, scale) : static_cast<uint8_t>(int8_quantize_weight(v, scale));
          }
        }
        break;
      }
      case WeightFormat::Mxfp4:
      case WeightFormat::Mxfp6E2M3:
      case WeightFormat::Mxfp6E3M2: {
        const int nb = cols / kMxBlock;
        uint8_t* sc = reinterpret_cast<uint8_t*>(o.scale->mutable_data()) + static_cast<int64_t>(e) * rows * nb;
        std::vector<uint8_t> codes(static_cast<size_t>(cols));
        for (int r = 0; r < rows; ++r) {
          for (int b = 0; b < nb; ++b) {
            const int shared = mx_quantize_block(w.data() + static_cast<size_t>(r) * cols + b * kMxBlock, kMxBlock,
                                                 mx_elem_of(s.weight), MxScaleMode::Even, codes.data() + b * kMxBlock);
            sc[static_cast<int64_t>(r) * nb + b] = mx_scale_byte_quark(shared);
          }
          if (s.weight == WeightFormat::Mxfp4) pack_fp4(codes.data(), cols, wrow0 + static_cast<int64_t>(r) * pc);
          else pack_fp6(codes.data(), cols, wrow0 + static_cast<int64_t>(r) * pc);
        }
        break;
      }
      case WeightFormat::Nvfp4: {
        const int nb = cols / kNvfp4Block;
        const float ws2 = nvfp4_global_scale(amax_of(0, static_cast<int64_t>(w.size())));
        o.scale2->mutable_data_as<float>()[e] = ws2;
        uint8_t* sc = reinterpret_cast<uint8_t*>(o.scale->mutable_data()) + static_cast<int64_t>(e) * rows * nb;
        std::vector<uint8_t> codes(static_cast<size_t>(cols));
        for (int r = 0; r < rows; ++r) {
          for (int b = 0; b < nb; ++b)
            sc[static_cast<int64_t>(r) * nb + b] = nvfp4_quantize_weight_block(
                w.data() + static_cast<size_t>(r) * cols + b * kNvfp4Block, kNvfp4Block, ws2, codes.data() + b * kNvfp4Block);
          pack_fp4(codes.data(), cols, wrow0 + static_cast<int64_t>(r) * pc);
        }
        break;
      }
    }
  }
  if (o.bias->defined()) {
    std::mt19937_64 rng(seed ^ 0xB1A5ull);
    std::normal_distribution<float> nd(0.0f, spec.bias_std);
    float* b = o.bias->mutable_data_as<float>() + static_cast<int64_t>(e) * rows;
    for (int r = 0; r < rows; ++r) b[r] = bf16_round(nd(rng));
  }
}

}  // namespace

ExpertParams make_random_expert_params(const RandomExpertsSpec& spec) {
  if (spec.scheme == nullptr) throw Error("make_random_expert_params: no scheme");
  const SchemeInfo& s = *spec.scheme;
  const int E = spec.num_experts, H = spec.hidden, I = spec.inter;
  if (E <= 0 || H <= 0 || I <= 0) throw Error(fmt::format("make_random_expert_params: bad sizes E={} H={} I={}", E, H, I));
  const int bs = weight_block_size(s.weight);
  if (bs > 0 && (H % bs != 0 || I % bs != 0))
    throw Error(fmt::format("make_random_expert_params: {} needs H and I multiples of {} (got {}, {})", s.name, bs, H, I));

  ExpertParams p;
  p.scheme = &s;
  p.act = spec.act;
  p.num_experts = E;
  p.hidden = H;
  p.inter = I;
  p.inter_full = I;
  p.expert_map = spec.expert_map;
  if (p.expert_map.empty())
    for (int g = 0; g < E; ++g) p.expert_map.push_back(g);
  if (static_cast<int>(p.expert_map.size()) != E)
    throw Error(fmt::format("make_random_expert_params: expert_map has {} entries, expected {}", p.expert_map.size(), E));
  int nl = 0;
  for (int g = 0; g < E; ++g) nl = std::max(nl, p.expert_map[static_cast<size_t>(g)] + 1);
  p.num_local = nl;
  p.local_to_global.assign(static_cast<size_t>(nl), -1);
  for (int g = 0; g < E; ++g)
    if (p.expert_map[static_cast<size_t>(g)] >= 0) p.local_to_global[static_cast<size_t>(p.expert_map[static_cast<size_t>(g)])] = g;

  const int64_t R13 = 2LL * I;
  const DType wdt = s.weight == WeightFormat::BF16 ? spec.unquantized_dtype
                    : s.weight == WeightFormat::Int8  ? DType::I8
                    : s.weight == WeightFormat::Fp8E4M3 ? DType::F8_E4M3
                                                        : DType::U8;
  p.w13_weight = Tensor::zeros(wdt, {nl, R13, weight_packed_cols(s.weight, H)});
  p.w2_weight = Tensor::zeros(wdt, {nl, H, weight_packed_cols(s.weight, I)});
  switch (s.weight_scale) {
    case WeightScale::None: break;
    case WeightScale::PerTensor:
      p.w13_weight_scale = Tensor::zeros(DType::F32, {nl});
      p.w2_weight_scale = Tensor::zeros(DType::F32, {nl});
      break;
    case WeightScale::PerChannel:
      p.w13_weight_scale = Tensor::zeros(DType::F32, {nl, R13});
      p.w2_weight_scale = Tensor::zeros(DType::F32, {nl, H});
      break;
    case WeightScale::MxE8M0:
      p.w13_weight_scale = Tensor::zeros(DType::U8, {nl, R13, H / kMxBlock});
      p.w2_weight_scale = Tensor::zeros(DType::U8, {nl, H, I / kMxBlock});
      break;
    case WeightScale::Nvfp4:
      p.w13_weight_scale = Tensor::zeros(DType::F8_E4M3, {nl, R13, H / kNvfp4Block});
      p.w2_weight_scale = Tensor::zeros(DType::F8_E4M3, {nl, H, I / kNvfp4Block});
      p.w13_weight_scale_2 = Tensor::zeros(DType::F32, {nl});
      p.w2_weight_scale_2 = Tensor::zeros(DType::F32, {nl});
      break;
  }
  if (spec.bias) {
    p.w13_bias = Tensor::zeros(DType::F32, {nl, R13});
    p.w2_bias = Tensor::zeros(DType::F32, {nl, H});
  }
  for (int e = 0; e < nl; ++e) {
    const uint64_t seed = spec.seed * 1000003ull + static_cast<uint64_t>(e) * 7919ull;
    fill_projection(spec, s, e, static_cast<int>(R13), H,
                    {&p.w13_weight, &p.w13_weight_scale, &p.w13_weight_scale_2, &p.w13_bias}, seed);
    fill_projection(spec, s, e, H, I, {&p.w2_weight, &p.w2_weight_scale, &p.w2_weight_scale_2, &p.w2_bias}, seed + 1);
  }

  // Static activation scales (dequantization direction; NVFP4: quantization-direction gs) for
  // GEMM1 inputs ~ N(0, 1) (amax ≈ 4) and intermediates of amax ≈ 2.
  switch (s.act) {
    case ActQuant::Fp8Static:
      p.a13_scale = 4.0f / kFp8E4M3Max;
      p.a2_scale = 2.0f / kFp8E4M3Max;
      break;
    case ActQuant::Int8Static:
      p.a13_scale = 4.0f / 127.0f;
      p.a2_scale = 2.0f / 127.0f;
      break;
    case ActQuant::Nvfp4:
      p.a13_scale = 1.0f / nvfp4_global_scale(4.0f);
      p.a2_scale = 1.0f / nvfp4_global_scale(2.0f);
      break;
    default: break;
  }
  p.processed = true;
  return p;
}

int64_t expert_weight_bytes(const ExpertParams& p) {
  if (p.num_local <= 0) return 0;
  int64_t total = 0;
  for (const Tensor* t : {&p.w13_weight, &p.w2_weight, &p.w13_weight_scale, &p.w2_weight_scale})
    if (t->defined()) total += static_cast<int64_t>(t->nbytes());
  return total / p.num_local;
}

}  // namespace qmoe::cpu
