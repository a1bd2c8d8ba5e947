// Routing: router logits → top-k expert ids and weights (spec quark-moe.md §8, §16.7).
// fp32 math like torch: softmax = exp(x − max) / Σ, sigmoid = 1 / (1 + exp(−x)); every top-k
// is an iterative argmax whose ties go to the lower expert (or group) id.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Indices of the k largest values of v[0..n) (ties → lower index), in selection order.
void top_k_indices(const float* v, int n, int k, std::vector<char>& taken, int32_t* out) {
  taken.assign(static_cast<size_t>(n), 0);
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i)
      if (!taken[static_cast<size_t>(i)] && (best < 0 || v[i] > v[best])) best = i;
    taken[static_cast<size_t>(best)] = 1;
    out[j] = best;
  }
}

void softmax(const float* x, int n, float* out) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - m);
    sum += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] = out[i] / sum;
}

void check_config(const RoutingConfig& rc, int T, int E, int K, const float* bias) {
  validate_routing(rc, T, E, K, bias != nullptr);
  if (bias != nullptr)
    for (int e = 0; e < E; ++e)
      if (!std::isfinite(bias[e]))
        throw Error(fmt::format("route: e_score_correction_bias[{}] = {} is not finite", e, bias[e]));
}

}  // namespace

void validate_routing(const RoutingConfig& rc, int T, int E, int K, bool has_bias) {
  if (T < 0) throw Error(fmt::format("route: token count T = {} is negative", T));
  if (E < 1) throw Error(fmt::format("route: number of experts E = {} must be at least 1", E));
  if (K < 1 || K > E) throw Error(fmt::format("route: top_k = {} must be in [1, E = {}]", K, E));
  if (rc.has_correction_bias && !has_bias)
    throw Error("route: the routing config uses e_score_correction_bias but none was given");
  if (rc.n_group > 1) {
    if (E % rc.n_group != 0)
      throw Error(fmt::format("route: num_experts {} is not divisible by n_group {}", E, rc.n_group));
    if (rc.topk_group < 1 || rc.topk_group > rc.n_group)
      throw Error(fmt::format("route: topk_group = {} must be in [1, n_group = {}]", rc.topk_group, rc.n_group));
    if (K > rc.topk_group * (E / rc.n_group))
      throw Error(fmt::format("route: top_k = {} exceeds the {} experts of the topk_group = {} kept groups", K,
                              rc.topk_group * (E / rc.n_group), rc.topk_group));
  }
}

void route(const RoutingConfig& rc, const float* logits, int T, int E, int K, const float* correction_bias,
           int32_t* topk_ids, float* topk_weights) {
  check_config(rc, T, E, K, correction_bias);
  if (T == 0) return;
  if (logits == nullptr || topk_ids == nullptr || topk_weights == nullptr)
    throw Error("route: logits, topk_ids and topk_weights must not be null");

  const bool grouped = rc.n_group > 1 && rc.topk_group < rc.n_group;
  // Per-thread buffers, grown only: routing allocates nothing per call once warmed up.
  struct Scratch {
    std::vector<float> scores, choice, group_score, sel_logits;
    std::vector<char> taken, keep;
    std::vector<int32_t> kept_groups;
  };
  thread_local Scratch sc;
  auto& [scores, choice, group_score, sel_logits, taken, keep, kept_groups] = sc;
  scores.resize(static_cast<size_t>(E));
  choice.resize(static_cast<size_t>(E));
  group_score.resize(static_cast<size_t>(rc.n_group > 1 ? rc.n_group : 1));
  kept_groups.resize(static_cast<size_t>(rc.topk_group > 0 ? rc.topk_group : 1));
  sel_logits.resize(static_cast<size_t>(K));

  for (int t = 0; t < T; ++t) {
    const float* l = logits + static_cast<size_t>(t) * E;
    int32_t* ids = topk_ids + static_cast<size_t>(t) * K;
    float* w = topk_weights + static_cast<size_t>(t) * K;
    for (int e = 0; e < E; ++e)
      if (!std::isfinite(l[e]))
        throw Error(fmt::format("router logits of token {} are not finite (expert {}: {})", t, e, l[e]));

    if (rc.topk_then_softmax) {
      // gpt-oss: top-k of the (optionally biased) logits, softmax over the k selected logits.
      for (int e = 0; e < E; ++e) choice[static_cast<size_t>(e)] = correction_bias ? l[e] + correction_bias[e] : l[e];
      top_k_indices(choice.data(), E, K, taken, ids);
      for (int k = 0; k < K; ++k) sel_logits[static_cast<size_t>(k)] = l[ids[k]];
      softmax(sel_logits.data(), K, w);
    } else {
      if (rc.scoring == ScoringFunc::Softmax) {
        softmax(l, E, scores.data());
      } else {
        for (int e = 0; e < E; ++e) scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
      }
      for (int e = 0; e < E; ++e)
        choice[static_cast<size_t>(e)] =
            correction_bias ? scores[static_cast<size_t>(e)] + correction_bias[e] : scores[static_cast<size_t>(e)];
      if (grouped) {
        const int gsize = E / rc.n_group;
        for (int g = 0; g < rc.n_group; ++g) {
          const float* c = choice.data() + static_cast<size_t>(g) * gsize;
          if (correction_bias != nullptr) {  // sum of the two best biased scores of the group
            int32_t best[2] = {0, 0};
            const int n2 = gsize < 2 ? gsize : 2;
            top_k_indices(c, gsize, n2, taken, best);
            float s = 0.0f;
            for (int j = 0; j < n2; ++j) s += c[best[j]];
            group_score[static_cast<size_t>(g)] = s;
          } else {
            float m = c[0];
            for (int j = 1; j < gsize; ++j) m = c[j] > m ? c[j] : m;
            group_score[static_cast<size_t>(g)] = m;
          }
        }
        top_k_indices(group_score.data(), rc.n_group, rc.topk_group, taken, kept_groups.data());
        keep.assign(static_cast<size_t>(rc.n_group), 0);
        for (int j = 0; j < rc.topk_group; ++j) keep[static_cast<size_t>(kept_groups[static_cast<size_t>(j)])] = 1;
        for (int e = 0; e < E; ++e)
          if (!keep[static_cast<size_t>(e / gsize)]) choice[static_cast<size_t>(e)] = kNegInf;
      }
      top_k_indices(choice.data(), E, K, taken, ids);
      for (int k = 0; k < K; ++k) w[k] = scores[static_cast<size_t>(ids[k])];
      if (rc.renormalize) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += w[k];
        if (sum > 0.0f)
          for (int k = 0; k < K; ++k) w[k] = w[k] / sum;
      }
    }
    if (rc.routed_scaling_factor != 1.0f)
      for (int k = 0; k < K; ++k) w[k] *= rc.routed_scaling_factor;
  }
}

}  // namespace qmoe
