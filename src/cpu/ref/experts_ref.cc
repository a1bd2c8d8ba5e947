// The scalar reference of the expert computation (spec quark-moe.md §9, precision chain §16.6):
//   x (fp32) [× w[t,0] when the router weight goes on the input] → GEMM1-input QDQ (exact values)
//   → GEMM1 with exactly dequantized fp32 weights, fp64 accumulation, + bias → fp32
//   → gated activation (double, rounded to fp32) → intermediate QDQ → GEMM2 (fp64) + bias → fp32
//   → × router weight (fp32) → out[t] += Σ_k in k order (fp32).
// Slots are (t, k) pairs, slot = t·K + k; slots whose expert is not local contribute nothing.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

namespace {

void validate_args(const ExpertsArgs& a) {
  if (a.params == nullptr) throw Error("experts_reference: ExpertsArgs.params is null");
  if (a.T < 0) throw Error(fmt::format("experts_reference: token count T = {} is negative", a.T));
  if (a.K < 1) throw Error(fmt::format("experts_reference: top_k K = {} must be at least 1", a.K));
  if (a.T > 0 && (a.x == nullptr || a.out == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr))
    throw Error("experts_reference: ExpertsArgs.x, out, topk_ids and topk_weights must all be set");
  if (a.router_weight_on_input && a.K != 1)
    throw Error(fmt::format("experts_reference: apply_router_weight_on_input needs top_k == 1, got K = {}", a.K));
}

// Local expert of every slot (−1: not on this rank), with the ids checked against E.
std::vector<int> local_expert_of_slots(const ExpertsArgs& a) {
  const ExpertParams& p = *a.params;
  std::vector<int> local(static_cast<size_t>(a.T) * a.K, -1);
  for (int64_t s = 0; s < static_cast<int64_t>(local.size()); ++s) {
    const int32_t id = a.topk_ids[s];
    if (id < 0 || id >= p.num_experts)
      throw Error(fmt::format("experts_reference: topk_ids[{}, {}] = {} is outside [0, {})", s / a.K, s % a.K, id,
                              p.num_experts));
    local[static_cast<size_t>(s)] = p.expert_map[static_cast<size_t>(id)];
  }
  return local;
}

}  // namespace

void experts_reference(const ExpertsArgs& a) {
  validate_args(a);
  const ExpertParams& p = *a.params;
  ref::validate_expert_params(p, "experts_reference");
  check_experts_inputs(a, "experts_reference");
  if (a.T == 0) return;
  const int T = a.T, K = a.K, H = p.hidden, I = p.inter, R13 = 2 * p.inter;
  const int64_t slots = static_cast<int64_t>(T) * K;

  const std::vector<int> local = local_expert_of_slots(a);
  std::vector<std::vector<int64_t>> slots_of(static_cast<size_t>(p.num_local));
  for (int64_t s = 0; s < slots; ++s)
    if (local[static_cast<size_t>(s)] >= 0) slots_of[static_cast<size_t>(local[static_cast<size_t>(s)])].push_back(s);

  // GEMM1 input: x (× w[t,0]), quantize-dequantized per token row.
  std::vector<float> xin(a.x, a.x + static_cast<int64_t>(T) * H);
  if (a.router_weight_on_input)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) xin[static_cast<size_t>(t) * H + h] *= a.topk_weights[t];
  const ref::ActQuantRule rule1 = ref::gemm1_act_rule(p);
  const float scale1 = ref::act_tensor_scale(rule1, ref::abs_max(xin.data(), static_cast<int64_t>(xin.size())));
  std::vector<double> xq(xin.size());
  for (int t = 0; t < T; ++t)
    ref::act_qdq_row(rule1, xin.data() + static_cast<size_t>(t) * H, H, scale1, xq.data() + static_cast<size_t>(t) * H);

  // GEMM1 + activation → z [slots, I] (fp32).
  std::vector<float> z(static_cast<size_t>(slots) * I, 0.0f);
  std::vector<float> w, bias, y1(static_cast<size_t>(R13));
  for (int e = 0; e < p.num_local; ++e) {
    if (slots_of[static_cast<size_t>(e)].empty()) continue;
    ref::decode_weight(p, ref::Proj::W13, e, w);
    ref::decode_bias(p, ref::Proj::W13, e, bias);
    for (int64_t s : slots_of[static_cast<size_t>(e)]) {
      const double* xr = xq.data() + (s / K) * H;
      for (int n = 0; n < R13; ++n) {
        const float* wr = w.data() + static_cast<size_t>(n) * H;
        double acc = 0.0;
        for (int h = 0; h < H; ++h) acc += xr[h] * static_cast<double>(wr[h]);
        y1[static_cast<size_t>(n)] = static_cast<float>(acc + static_cast<double>(bias[static_cast<size_t>(n)]));
      }
      ref::apply_activation_row(p.act, y1.data(), I, z.data() + s * I);
    }
  }

  // GEMM2 input: the intermediate, quantize-dequantized per slot row (per-tensor: over all local rows).
  const ref::ActQuantRule rule2 = ref::gemm2_act_rule(p);
  float zmax = 0.0f;
  if (rule2.kind == ActQuant::Fp8DynTensor)
    for (int64_t s = 0; s < slots; ++s)
      if (local[static_cast<size_t>(s)] >= 0) {
        const float m = ref::abs_max(z.data() + s * I, I);
        if (std::isnan(m) || m > zmax) zmax = m;
      }
  const float scale2 = ref::act_tensor_scale(rule2, zmax);
  std::vector<double> zq(z.size(), 0.0);
  for (int64_t s = 0; s < slots; ++s)
    if (local[static_cast<size_t>(s)] >= 0) ref::act_qdq_row(rule2, z.data() + s * I, I, scale2, zq.data() + s * I);

  // GEMM2 + bias, × router weight → y2 [slots, H].
  std::vector<float> y2(static_cast<size_t>(slots) * H, 0.0f);
  for (int e = 0; e < p.num_local; ++e) {
    if (slots_of[static_cast<size_t>(e)].empty()) continue;
    ref::decode_weight(p, ref::Proj::W2, e, w);
    ref::decode_bias(p, ref::Proj::W2, e, bias);
    for (int64_t s : slots_of[static_cast<size_t>(e)]) {
      const double* zr = zq.data() + s * I;
      const float rw = a.topk_weights[s];
      for (int h = 0; h < H; ++h) {
        const float* wr = w.data() + static_cast<size_t>(h) * I;
        double acc = 0.0;
        for (int j = 0; j < I; ++j) acc += zr[j] * static_cast<double>(wr[j]);
        float v = static_cast<float>(acc + static_cast<double>(bias[static_cast<size_t>(h)]));
        if (!a.router_weight_on_input) v *= rw;
        y2[static_cast<size_t>(s) * H + h] = v;
      }
    }
  }

  // Combine: Σ_k in k order, fp32.
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float sum = 0.0f;
      bool any = false;
      for (int k = 0; k < K; ++k) {
        const int64_t s = static_cast<int64_t>(t) * K + k;
        if (local[static_cast<size_t>(s)] < 0) continue;
        sum = any ? sum + y2[static_cast<size_t>(s) * H + h] : y2[static_cast<size_t>(s) * H + h];
        any = true;
      }
      if (any) a.out[static_cast<size_t>(t) * H + h] += sum;
    }
}

}  // namespace qmoe
