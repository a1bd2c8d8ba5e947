// quantize_linear / quantized_linear_layout / dequantize_linear: one Linear as Quark exports it
// (checkpoint-format.md §4). Every element and scale comes from the formats library (formats.h).
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/quantizer.h"
#include "quantizer/parallel.h"

namespace qmoe {

namespace {

using quantizer_detail::parallel_for;

constexpr float kFltEps = 1.1920928955078125e-07f;

MxElem mx_elem_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::Mxfp4: return MxElem::Fp4E2M1;
    case WeightFormat::Mxfp6E2M3: return MxElem::Fp6E2M3;
    case WeightFormat::Mxfp6E3M2: return MxElem::Fp6E3M2;
    default: break;
  }
  throw Error(fmt::format("internal: weight format {} is not an MX format", to_string(f)));
}

// Packed bytes per row of `in` elements (the quantizer writes unquantized rows as bf16).
int64_t packed_row_bytes(WeightFormat f, int64_t in) {
  return weight_packed_cols(f, in) * (f == WeightFormat::BF16 ? 2 : 1);
}

std::string join(std::string_view prefix, std::string_view suffix) {
  std::string s(prefix);
  s += suffix;
  return s;
}

Tensor scalar_f32(float v) {
  Tensor t = Tensor::zeros(DType::F32, {});
  std::memcpy(t.mutable_data(), &v, 4);
  return t;
}

void check_shape(std::string_view prefix, int64_t out, int64_t in, const SchemeInfo& s) {
  if (out <= 0 || in <= 0)
    throw Error(fmt::format("linear '{}': weight shape [{}, {}] must be positive", prefix, out, in));
  const int block = weight_block_size(s.weight);
  if (block > 0 && in % block != 0)
    throw Error(fmt::format("linear '{}': input dimension {} is not a multiple of the {} block size {} "
                            "(weight [out={}, in={}])",
                            prefix, in, s.name, block, out, in));
}

// Static activation scale tensors of a scheme (empty for dynamic / weight-only).
void append_input_scales(std::string_view prefix, const SchemeInfo& s, const LinearQuantOptions& opt,
                         std::vector<NamedTensor>& out) {
  if (!act_is_static(s.act)) return;
  if (!opt.input_amax.has_value())
    throw Error(fmt::format("linear '{}': scheme {} has static activation scales ({}), which need calibration "
                            "data (the input amax); none was given",
                            prefix, s.name, to_string(s.act)));
  const float amax = *opt.input_amax;
  if (!std::isfinite(amax) || amax < 0.0f)
    throw Error(fmt::format("linear '{}': calibration input amax {} is not a finite non-negative number", prefix, amax));
  switch (s.act) {
    case ActQuant::Fp8Static:
      out.push_back({join(prefix, ".input_scale"), scalar_f32(std::max(amax / kFp8E4M3Max, kFltEps))});
      break;
    case ActQuant::Int8Static:
      out.push_back({join(prefix, ".input_scale"), scalar_f32(std::max(amax / 127.0f, kFltEps))});
      out.push_back({join(prefix, ".input_zero_point"), Tensor::zeros(DType::I8, {})});
      break;
    case ActQuant::Nvfp4: {
      const float s2 = nvfp4_global_scale(amax);
      out.push_back({join(prefix, ".input_scale_2"), scalar_f32(s2 > 0.0f ? s2 : kFltEps)});
      break;
    }
    default: break;
  }
}

// max |w| over rows [r0, r1); throws on a non-finite value.
float rows_amax(std::string_view prefix, const float* w, int64_t in, int64_t r0, int64_t r1) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * in;
    for (int64_t i = 0; i < in; ++i) {
      const float a = std::fabs(row[i]);
      if (!(a <= 3.4028234663852886e38f))
        throw Error(fmt::format("linear '{}': weight element [{}, {}] is {} (weights must be finite)", prefix, r, i,
                                row[i]));
      amax = std::max(amax, a);
    }
  }
  return amax;
}

float tensor_amax(std::string_view prefix, const float* w, int64_t out, int64_t in, int threads) {
  const int64_t chunks = std::min<int64_t>(out, std::max(1, threads) * 4);
  std::vector<float> part(static_cast<size_t>(chunks), 0.0f);
  parallel_for(chunks, threads, [&](int64_t c) {
    const int64_t r0 = out * c / chunks, r1 = out * (c + 1) / chunks;
    part[static_cast<size_t>(c)] = rows_amax(prefix, w, in, r0, r1);
  });
  return *std::max_element(part.begin(), part.end());
}

// Run fn(r0, r1) over row ranges on opt.threads threads.
template <class Fn>
void for_row_ranges(int64_t out, int threads, Fn&& fn) {
  const int64_t chunks = std::min<int64_t>(out, std::max(1, threads) * 4);
  parallel_for(chunks, threads, [&](int64_t c) { fn(out * c / chunks, out * (c + 1) / chunks); });
}

}  // namespace

std::vector<TensorInfo> quantized_linear_layout(std::string_view prefix, int64_t out, int64_t in,
                                                const SchemeInfo& s) {
  check_shape(prefix, out, in, s);
  std::vector<TensorInfo> v;
  auto add = [&](std::string_view suffix, DType d, Shape shape) {
    TensorInfo t;
    t.name = join(prefix, suffix);
    t.dtype = d;
    t.shape = std::move(shape);
    v.push_back(std::move(t));
  };
  const bool per_channel = s.weight_scale == WeightScale::PerChannel;
  const Shape scale_shape = per_channel ? Shape{out} : Shape{};
  switch (s.weight) {
    case WeightFormat::BF16: add(".weight", DType::BF16, {out, in}); break;
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2:
      add(".weight", DType::U8, {out, packed_row_bytes(s.weight, in)});
      add(".weight_scale", DType::U8, {out, in / kMxBlock});
      break;
    case WeightFormat::Nvfp4:
      add(".weight", DType::U8, {out, in / 2});
      add(".weight_scale", DType::F8_E4M3, {out, in / kNvfp4Block});
      add(".weight_scale_2", DType::F32, {});
      break;
    case WeightFormat::Int8:
      add(".weight", DType::I8, {out, in});
      add(".weight_scale", DType::F32, scale_shape);
      add(".weight_zero_point", DType::I8, scale_shape);
      break;
    case WeightFormat::Fp8E4M3:
      add(".weight", DType::F8_E4M3, {out, in});
      add(".weight_scale", DType::F32, scale_shape);
      break;
  }
  switch (s.act) {
    case ActQuant::Fp8Static: add(".input_scale", DType::F32, {}); break;
    case ActQuant::Int8Static:
      add(".input_scale", DType::F32, {});
      add(".input_zero_point", DType::I8, {});
      break;
    case ActQuant::Nvfp4: add(".input_scale_2", DType::F32, {}); break;
    default: break;
  }
  return v;
}

std::vector<NamedTensor> quantize_linear(std::string_view prefix, const float* w, int64_t out, int64_t in,
                                         const SchemeInfo& s, const LinearQuantOptions& opt) {
  check_shape(prefix, out, in, s);
  const int threads = std::max(1, opt.threads);
  std::vector<NamedTensor> res;

  switch (s.weight) {
    case WeightFormat::BF16: {
      Tensor t = Tensor::zeros(DType::BF16, {out, in});
      auto* q = t.mutable_data_as<uint16_t>();
      for_row_ranges(out, threads, [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0 * in; i < r1 * in; ++i) q[i] = bf16_encode(w[i]);
      });
      res.push_back({join(prefix, ".weight"), std::move(t)});
      break;
    }
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      const MxElem elem = mx_elem_of(s.weight);
      const bool fp4 = s.weight == WeightFormat::Mxfp4;
      const int64_t row_bytes = packed_row_bytes(s.weight, in);
      const int64_t nblk = in / kMxBlock;
      Tensor qt = Tensor::zeros(DType::U8, {out, row_bytes});
      Tensor st = Tensor::zeros(DType::U8, {out, nblk});
      auto* q = qt.mutable_data_as<uint8_t>();
      auto* sc = st.mutable_data_as<uint8_t>();
      for_row_ranges(out, threads, [&](int64_t r0, int64_t r1) {
        rows_amax(prefix, w, in, r0, r1);  // finiteness check
        uint8_t codes[kMxBlock];
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t b = 0; b < nblk; ++b) {
            const int e = mx_quantize_block(w + r * in + b * kMxBlock, kMxBlock, elem, opt.mx_scale_mode, codes);
            sc[r * nblk + b] = mx_scale_byte_quark(e);
            uint8_t* dst = q + r * row_bytes + (fp4 ? b * kMxBlock / 2 : b * kMxBlock * 3 / 4);
            if (fp4)
              pack_fp4(codes, kMxBlock, dst);
            else
              pack_fp6(codes, kMxBlock, dst);
          }
        }
      });
      res.push_back({join(prefix, ".weight"), std::move(qt)});
      res.push_back({join(prefix, ".weight_scale"), std::move(st)});
      break;
    }
    case WeightFormat::Nvfp4: {
      const float tensor_max = tensor_amax(prefix, w, out, in, threads);
      if (opt.weight_amax && !(*opt.weight_amax >= tensor_max && std::isfinite(*opt.weight_amax)))
        throw Error(fmt::format("linear '{}': shared weight amax {} is below the weight's own amax {}", prefix,
                                *opt.weight_amax, tensor_max));
      float ws2 = nvfp4_global_scale(opt.weight_amax ? *opt.weight_amax : tensor_max);
      // An all-zero weight would get weight_scale_2 = 0, which loaders reject as a broken scale;
      // floored like the FP8 / INT8 scales (docs/DECISIONS.md). Its blocks still encode zeros.
      if (!(ws2 > 0.0f)) ws2 = FLT_EPSILON;
      const int64_t nblk = in / kNvfp4Block;
      Tensor qt = Tensor::zeros(DType::U8, {out, in / 2});
      Tensor st = Tensor::zeros(DType::F8_E4M3, {out, nblk});
      auto* q = qt.mutable_data_as<uint8_t>();
      auto* sc = st.mutable_data_as<uint8_t>();
      for_row_ranges(out, threads, [&](int64_t r0, int64_t r1) {
        uint8_t codes[kNvfp4Block];
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t b = 0; b < nblk; ++b) {
            sc[r * nblk + b] = nvfp4_quantize_weight_block(w + r * in + b * kNvfp4Block, kNvfp4Block, ws2, codes);
            pack_fp4(codes, kNvfp4Block, q + r * (in / 2) + b * kNvfp4Block / 2);
          }
      });
      res.push_back({join(prefix, ".weight"), std::move(qt)});
      res.push_back({join(prefix, ".weight_scale"), std::move(st)});
      res.push_back({join(prefix, ".weight_scale_2"), scalar_f32(ws2)});
      break;
    }
    case WeightFormat::Int8:
    case WeightFormat::Fp8E4M3: {
      const bool int8 = s.weight == WeightFormat::Int8;
      const bool per_channel = s.weight_scale == WeightScale::PerChannel;
      const Shape scale_shape = per_channel ? Shape{out} : Shape{};
      Tensor qt = Tensor::zeros(int8 ? DType::I8 : DType::F8_E4M3, {out, in});
      Tensor st = Tensor::zeros(DType::F32, scale_shape);
      auto* q = qt.mutable_data_as<uint8_t>();
      auto* sc = st.mutable_data_as<float>();
      auto scale_of = [&](float amax) { return int8 ? int8_weight_scale(amax) : fp8_weight_scale(amax); };
      const float tensor_scale = per_channel ? 0.0f : scale_of(tensor_amax(prefix, w, out, in, threads));
      if (!per_channel) sc[0] = tensor_scale;
      for_row_ranges(out, threads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = w + r * in;
          float scale = tensor_scale;
          if (per_channel) {
            scale = scale_of(rows_amax(prefix, w, in, r, r + 1));
            sc[r] = scale;
          }
          uint8_t* dst = q + r * in;
          if (int8) {
            for (int64_t i = 0; i < in; ++i) dst[i] = static_cast<uint8_t>(int8_quantize_weight(row[i], scale));
          } else {
            for (int64_t i = 0; i < in; ++i) dst[i] = fp8_quantize_weight(row[i], scale);
          }
        }
      });
      res.push_back({join(prefix, ".weight"), std::move(qt)});
      res.push_back({join(prefix, ".weight_scale"), std::move(st)});
      if (int8) res.push_back({join(prefix, ".weight_zero_point"), Tensor::zeros(DType::I8, scale_shape)});
      break;
    }
  }
  append_input_scales(prefix, s, opt, res);
  return res;
}

std::vector<float> dequantize_linear(std::string_view prefix, const std::vector<NamedTensor>& tensors,
                                     const SchemeInfo& s) {
  auto find = [&](std::string_view suffix) -> const Tensor& {
    const std::string name = join(prefix, suffix);
    for (const auto& t : tensors)
      if (t.name == name) return t.tensor;
    throw Error(fmt::format("dequantize_linear: tensor '{}' not found", name));
  };
  const Tensor& wt = find(".weight");
  if (wt.ndim() != 2) throw Error(fmt::format("dequantize_linear: '{}.weight' must be 2-D", prefix));
  const int64_t out = wt.dim(0);
  std::vector<float> w;
  switch (s.weight) {
    case WeightFormat::BF16: return to_f32(wt, "weight");
    case WeightFormat::Mxfp4:
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      const bool fp4 = s.weight == WeightFormat::Mxfp4;
      const MxElem elem = mx_elem_of(s.weight);
      const int64_t row_bytes = wt.dim(1);
      const int64_t in = fp4 ? row_bytes * 2 : row_bytes * 4 / 3;
      const auto* q = wt.data_as<uint8_t>();
      const auto* sc = find(".weight_scale").data_as<uint8_t>();
      w.resize(static_cast<size_t>(out * in));
      for (int64_t r = 0; r < out; ++r)
        for (int64_t i = 0; i < in; ++i) {
          const uint8_t c = fp4 ? fp4_code_at(q + r * row_bytes, i) : fp6_code_at(q + r * row_bytes, i);
          w[static_cast<size_t>(r * in + i)] =
              mx_elem_decode(elem, c) * e8m0_decode(sc[r * (in / kMxBlock) + i / kMxBlock]);
        }
      return w;
    }
    case WeightFormat::Nvfp4: {
      const int64_t in = wt.dim(1) * 2;
      const auto* q = wt.data_as<uint8_t>();
      const auto* sc = find(".weight_scale").data_as<uint8_t>();
      const float ws2 = to_f32(find(".weight_scale_2"))[0];
      w.resize(static_cast<size_t>(out * in));
      for (int64_t r = 0; r < out; ++r)
        for (int64_t i = 0; i < in; ++i) {
          // e2m1·fp8 is exact in fp32; one rounding for the product with the global scale
          // (the value the loader and the conformance cases' dequant.* hold).
          const float code_x_scale = fp4_e2m1_decode(fp4_code_at(q + r * (in / 2), i)) *
                                     fp8_e4m3_decode(sc[r * (in / kNvfp4Block) + i / kNvfp4Block]);
          w[static_cast<size_t>(r * in + i)] = code_x_scale * ws2;
        }
      return w;
    }
    case WeightFormat::Int8:
    case WeightFormat::Fp8E4M3: {
      const int64_t in = wt.dim(1);
      const auto scale = to_f32(find(".weight_scale"));
      const bool per_channel = s.weight_scale == WeightScale::PerChannel;
      const auto* q = wt.data_as<uint8_t>();
      w.resize(static_cast<size_t>(out * in));
      for (int64_t r = 0; r < out; ++r) {
        const float sr = scale[per_channel ? static_cast<size_t>(r) : 0];
        for (int64_t i = 0; i < in; ++i) {
          const uint8_t c = q[r * in + i];
          const float v = s.weight == WeightFormat::Int8 ? static_cast<float>(static_cast<int8_t>(c)) : fp8_e4m3_decode(c);
          w[static_cast<size_t>(r * in + i)] = v * sr;
        }
      }
      return w;
    }
  }
  return w;
}

}  // namespace qmoe
