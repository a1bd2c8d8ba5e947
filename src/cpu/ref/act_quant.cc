// Activation quantize-dequantize rules of every ActQuant (spec quark-moe.md §9.1, §10, §16.1, §16.8).
#include <fmt/format.h>

#include <cmath>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"

namespace qmoe::ref {

namespace {

bool needs_static_scale(ActQuant a) {
  return a == ActQuant::Fp8Static || a == ActQuant::Int8Static || a == ActQuant::Nvfp4;
}

ActQuantRule make_rule(const ExpertParams& p, float scale, const char* field) {
  if (p.scheme == nullptr) throw Error("expert parameters have no scheme");
  ActQuantRule r;
  r.kind = p.scheme->act;
  r.mx_mode = p.act_scale_mode;
  r.static_scale = scale;
  if (needs_static_scale(r.kind) && !(std::isfinite(scale) && scale > 0.0f))
    throw Error(
        fmt::format("scheme {} needs a positive finite static activation scale in ExpertParams.{}, found {} "
                    "(were the parameters processed?)",
                    p.scheme->name, field, scale));
  return r;
}

MxElem mx_elem_of(ActQuant a) {
  switch (a) {
    case ActQuant::Mxfp4:
      return MxElem::Fp4E2M1;
    case ActQuant::Mxfp6E2M3:
      return MxElem::Fp6E2M3;
    default:
      return MxElem::Fp6E3M2;
  }
}

// Row scale (dequantization direction) of the fp8 / int8 rules; the codes follow from it.
template <class Out>
void qdq_row_impl(const ActQuantRule& r, const float* x, int n, float tensor_scale, Out* out) {
  switch (r.kind) {
    case ActQuant::None:
      for (int i = 0; i < n; ++i) out[i] = static_cast<Out>(x[i]);
      return;
    case ActQuant::Fp8Static:
    case ActQuant::Fp8DynToken:
    case ActQuant::Fp8DynTensor: {
      float s = r.static_scale;
      if (r.kind == ActQuant::Fp8DynToken) s = fp8_token_scale(abs_max(x, n));
      if (r.kind == ActQuant::Fp8DynTensor) s = tensor_scale;
      const float inv = 1.0f / s;
      for (int i = 0; i < n; ++i) {
        const double v = static_cast<double>(fp8_e4m3_decode(fp8_quantize_act(x[i], inv))) * static_cast<double>(s);
        out[i] = static_cast<Out>(v);
      }
      return;
    }
    case ActQuant::Int8Static: {
      const float s = r.static_scale;
      for (int i = 0; i < n; ++i)
        out[i] = static_cast<Out>(static_cast<double>(int8_quantize_static(x[i], s)) * static_cast<double>(s));
      return;
    }
    case ActQuant::Int8DynToken: {
      const float amax = abs_max(x, n);
      const float s = int8_token_scale(amax);
      const float inv = int8_token_inv_scale(amax);
      for (int i = 0; i < n; ++i)
        out[i] = static_cast<Out>(static_cast<double>(int8_quantize_token(x[i], inv)) * static_cast<double>(s));
      return;
    }
    case ActQuant::Mxfp4:
    case ActQuant::Mxfp6E2M3:
    case ActQuant::Mxfp6E3M2: {
      const MxElem e = mx_elem_of(r.kind);
      float buf[kMxBlock];
      for (int b = 0; b < n; b += kMxBlock) {
        const int len = n - b < kMxBlock ? n - b : kMxBlock;
        mx_qdq_block(x + b, len, e, r.mx_mode, buf);
        for (int i = 0; i < len; ++i) out[b + i] = static_cast<Out>(buf[i]);
      }
      return;
    }
    case ActQuant::Nvfp4: {
      float buf[kNvfp4Block];
      for (int b = 0; b < n; b += kNvfp4Block) {
        const int len = n - b < kNvfp4Block ? n - b : kNvfp4Block;
        nvfp4_qdq_block(x + b, len, r.static_scale, buf);
        for (int i = 0; i < len; ++i) out[b + i] = static_cast<Out>(buf[i]);
      }
      return;
    }
  }
  throw Error("unknown activation quantization rule");
}

}  // namespace

ActQuantRule gemm1_act_rule(const ExpertParams& p) { return make_rule(p, p.a13_scale, "a13_scale"); }
ActQuantRule gemm2_act_rule(const ExpertParams& p) { return make_rule(p, p.a2_scale, "a2_scale"); }

float abs_max(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) return a;
    if (a > m) m = a;
  }
  return m;
}

float act_tensor_scale(const ActQuantRule& r, float tensor_absmax) {
  return r.kind == ActQuant::Fp8DynTensor ? fp8_tensor_scale(tensor_absmax) : 0.0f;
}

void act_qdq_row(const ActQuantRule& r, const float* x, int n, float tensor_scale, double* out) {
  qdq_row_impl(r, x, n, tensor_scale, out);
}
void act_qdq_row(const ActQuantRule& r, const float* x, int n, float tensor_scale, float* out) {
  qdq_row_impl(r, x, n, tensor_scale, out);
}

}  // namespace qmoe::ref
