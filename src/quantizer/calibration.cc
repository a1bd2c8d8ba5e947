// Static activation calibration: route the calibration tokens with the source router, run each
// expert's GEMM1 in fp32 with the unquantized weights and the reference's gated activation
// (ref::apply_activation_row), record input amaxes.
#include "quantizer/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/params.h"
#include "quantizer/names.h"
#include "quantizer/parallel.h"

namespace qmoe::quantizer_detail {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Weight [out, in] of `prefix` as fp32, checking the shape.
std::vector<float> load_weight(const Checkpoint& ckpt, const ExpertLinear& l) {
  const std::string name = l.prefix + ".weight";
  const Tensor t = ckpt.get(name);
  if (t.shape() != Shape{l.out, l.in})
    throw Error(fmt::format("calibration: tensor '{}' in {} has shape {}, expected {}", name, ckpt.file_of(name),
                            shape_str(t.shape()), shape_str(Shape{l.out, l.in})));
  return to_f32(t, name);
}

std::vector<float> load_bias(const Checkpoint& ckpt, const std::string& name, int64_t n) {
  if (!ckpt.has(name)) return std::vector<float>(static_cast<size_t>(n), 0.0f);
  auto v = to_f32(ckpt.get(name), name);
  if (static_cast<int64_t>(v.size()) != n)
    throw Error(fmt::format("calibration: bias '{}' has {} elements, expected {}", name, v.size(), n));
  return v;
}

// GEMM1 + activation of one expert over the listed tokens; returns {amax in, amax act}.
ExpertInputAmax measure_expert(const Checkpoint& ckpt, const ModelConfig& cfg, const std::vector<ExpertLinear>& lin,
                               const std::vector<float>& x, const std::vector<float>& scale, const std::vector<int>& toks,
                               int H) {
  ExpertInputAmax r;
  r.tokens = static_cast<int>(toks.size());
  std::vector<float> wg, wu, bg, bu;
  int64_t I = 0;
  bool interleaved = false;
  if (lin[0].role == ProjRole::GateUp) {
    wg = load_weight(ckpt, lin[0]);
    bg = load_bias(ckpt, lin[0].prefix + ".bias", lin[0].out);
    I = lin[0].out / 2;
    interleaved = true;
  } else {
    wg = load_weight(ckpt, lin[0]);
    wu = load_weight(ckpt, lin[1]);
    I = lin[0].out;
    bg.assign(static_cast<size_t>(I), 0.0f);
    bu.assign(static_cast<size_t>(I), 0.0f);
  }
  // The gated activation is the reference's (ref::apply_activation_row on a GEMM1 output row
  // laid out as the loaded w13: gate rows then up rows, or interleaved gate / up).
  const ActivationSpec act = activation_spec_of(cfg, interleaved);
  std::vector<float> xt(static_cast<size_t>(H)), y1(static_cast<size_t>(2 * I)), z(static_cast<size_t>(I));
  for (size_t k = 0; k < toks.size(); ++k) {
    const float* row = x.data() + static_cast<int64_t>(toks[k]) * H;
    const float s = scale.empty() ? 1.0f : scale[k];
    for (int h = 0; h < H; ++h) {
      xt[static_cast<size_t>(h)] = row[h] * s;
      r.gemm1 = std::max(r.gemm1, std::fabs(xt[static_cast<size_t>(h)]));
    }
    if (interleaved) {
      for (int64_t n = 0; n < 2 * I; ++n)
        y1[static_cast<size_t>(n)] = dot(xt.data(), wg.data() + n * H, H) + bg[static_cast<size_t>(n)];
    } else {
      for (int64_t j = 0; j < I; ++j) {
        y1[static_cast<size_t>(j)] = dot(xt.data(), wg.data() + j * H, H) + bg[static_cast<size_t>(j)];
        y1[static_cast<size_t>(I + j)] = dot(xt.data(), wu.data() + j * H, H) + bu[static_cast<size_t>(j)];
      }
    }
    ref::apply_activation_row(act, y1.data(), static_cast<int>(I), z.data());
    for (int64_t j = 0; j < I; ++j) r.gemm2 = std::max(r.gemm2, std::fabs(z[static_cast<size_t>(j)]));
  }
  return r;
}

}  // namespace

std::vector<float> calibration_inputs(const SafetensorsFile& calib, int layer, int hidden, int& tokens) {
  const std::string per_layer = fmt::format("model.layers.{}.hidden_states", layer);
  const std::string name = calib.find(per_layer) ? per_layer : "hidden_states";
  if (!calib.find(name))
    throw Error(fmt::format("calibration file {} has neither '{}' nor 'hidden_states' (expected [N, {}] float "
                            "hidden states for MoE layer {})",
                            calib.path(), per_layer, hidden, layer));
  const Tensor t = calib.get(name);
  if (t.ndim() != 2 || t.dim(1) != hidden || t.dim(0) <= 0)
    throw Error(fmt::format("calibration tensor '{}' in {} has shape {}, expected [N, {}] with N > 0", name,
                            calib.path(), shape_str(t.shape()), hidden));
  auto v = to_f32(t, name);
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw Error(fmt::format("calibration tensor '{}' in {}: element {} is not finite", name, calib.path(), i));
  tokens = static_cast<int>(t.dim(0));
  return v;
}

LayerCalibration calibrate_layer(const Checkpoint& ckpt, const ModelConfig& cfg, int layer, const std::vector<float>& x,
                                 int tokens, bool routed, bool shared, int threads) {
  const int H = cfg.hidden_size, E = cfg.num_experts, K = cfg.top_k;
  LayerCalibration cal;
  if (routed) {
    const Tensor rw = ckpt.get(cfg.router_weight_name(layer));
    if (rw.shape() != Shape{E, H})
      throw Error(fmt::format("router weight '{}' has shape {}, expected [{}, {}]", cfg.router_weight_name(layer),
                              shape_str(rw.shape()), E, H));
    Tensor rb;
    const std::string bias_name = cfg.router_bias_name(layer);
    if (!bias_name.empty() && ckpt.has(bias_name)) rb = ckpt.get(bias_name);
    std::vector<float> corr;
    const std::string corr_name = cfg.correction_bias_name(layer);
    if (!corr_name.empty()) corr = to_f32(ckpt.get(corr_name), corr_name);
    std::vector<float> logits(static_cast<size_t>(tokens) * E);
    compute_router_logits(x.data(), tokens, H, rw, rb.defined() ? &rb : nullptr, logits.data());
    std::vector<int32_t> ids(static_cast<size_t>(tokens) * K);
    std::vector<float> wts(static_cast<size_t>(tokens) * K);
    route(cfg.routing, logits.data(), tokens, E, K, corr.empty() ? nullptr : corr.data(), ids.data(), wts.data());

    std::vector<std::vector<int>> toks(static_cast<size_t>(E));
    std::vector<std::vector<float>> scl(static_cast<size_t>(E));
    for (int t = 0; t < tokens; ++t)
      for (int k = 0; k < K; ++k) {
        const int e = ids[static_cast<size_t>(t * K + k)];
        if (e < 0 || e >= E) continue;
        toks[static_cast<size_t>(e)].push_back(t);
        if (cfg.routing.apply_router_weight_on_input) scl[static_cast<size_t>(e)].push_back(wts[static_cast<size_t>(t * K + k)]);
      }
    std::vector<int> all(static_cast<size_t>(tokens));
    for (int t = 0; t < tokens; ++t) all[static_cast<size_t>(t)] = t;
    cal.experts.resize(static_cast<size_t>(E));
    parallel_for(E, threads, [&](int64_t e) {
      const auto& te = toks[static_cast<size_t>(e)];
      const auto lin = routed_expert_linears(cfg, layer, static_cast<int>(e));
      ExpertInputAmax r = te.empty() ? measure_expert(ckpt, cfg, lin, x, {}, all, H)
                                     : measure_expert(ckpt, cfg, lin, x, scl[static_cast<size_t>(e)], te, H);
      r.tokens = static_cast<int>(te.size());
      cal.experts[static_cast<size_t>(e)] = r;
    });
  }
  if (shared) {
    const auto lin = shared_expert_linears(cfg, layer);
    if (!lin.empty()) {
      // Every token goes through the shared expert: split the tokens over the threads.
      const int chunks = std::max(1, std::min(threads, tokens));
      std::vector<ExpertInputAmax> part(static_cast<size_t>(chunks));
      parallel_for(chunks, threads, [&](int64_t c) {
        std::vector<int> sub;
        for (int64_t t = tokens * c / chunks; t < tokens * (c + 1) / chunks; ++t) sub.push_back(static_cast<int>(t));
        part[static_cast<size_t>(c)] = measure_expert(ckpt, cfg, lin, x, {}, sub, H);
      });
      ExpertInputAmax r;
      for (const auto& p : part) {
        r.gemm1 = std::max(r.gemm1, p.gemm1);
        r.gemm2 = std::max(r.gemm2, p.gemm2);
        r.tokens += p.tokens;
      }
      cal.shared = r;
    }
  }
  return cal;
}

}  // namespace qmoe::quantizer_detail
