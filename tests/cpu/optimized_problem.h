// A random MoE experts problem for the optimized-kernel tests (test_optimized.cc, test_no_alloc.cc):
// processed random expert parameters of a registry scheme, N(0, 1) hidden states and top-k routing
// by a Case (shape, routing edge case, expert map, routing weight on the input).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/random_params.h"
#include "qmoe/moe.h"
#include "qmoe/schemes.h"

namespace qmoe::cpu::test {

enum class Routing { Uniform, SkipLast, AllOnOne, TopkAll };

struct Case {
  std::string name;
  int E, H, I, K, T;
  Routing routing = Routing::Uniform;
  std::vector<int> expert_map;  // empty: all local
  bool on_input = false;        // router weight on the input (K = 1)
};

struct Problem {
  ExpertParams params;
  std::vector<float> x, weights;
  std::vector<int32_t> ids;
  int T = 0, K = 0, H = 0;
};

inline ActivationSpec activation_named(const std::string& n) {
  ActivationSpec a;
  if (n == "gelu_tanh") a.kind = Activation::GeluTanh;
  if (n == "swigluoai") {
    a.kind = Activation::SwigluOai;
    a.interleaved = true;
    a.alpha = 1.702f;
    a.limit = 7.0f;
  }
  return a;
}

inline Problem make_problem(const SchemeInfo& s, const std::string& act, const Case& st, uint64_t seed) {
  Problem pr;
  RandomExpertsSpec spec;
  spec.scheme = &s;
  spec.num_experts = st.E;
  spec.hidden = st.H;
  spec.inter = st.I;
  spec.act = activation_named(act);
  spec.bias = act != "silu";
  spec.bias_std = act == "swigluoai" ? 1.5f : 0.1f;  // large biases make the swigluoai clamps engage
  spec.expert_map = st.expert_map;
  spec.seed = seed;
  pr.params = make_random_expert_params(spec);
  pr.T = st.T;
  pr.K = st.K;
  pr.H = st.H;
  std::mt19937_64 rng(seed ^ 0x5EEDull);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  pr.x.resize(static_cast<size_t>(st.T) * st.H);
  for (float& v : pr.x) v = nd(rng) * (act == "swigluoai" ? 2.0f : 1.0f);
  pr.ids.resize(static_cast<size_t>(st.T) * st.K);
  pr.weights.resize(pr.ids.size());
  for (int t = 0; t < st.T; ++t) {
    std::vector<int> pool;
    const int n_allowed = st.routing == Routing::SkipLast ? st.E - 1 : st.E;
    for (int e = 0; e < n_allowed; ++e) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    if (st.routing == Routing::AllOnOne) {  // every token's first choice is expert E-1
      auto it = std::find(pool.begin(), pool.end(), st.E - 1);
      std::iter_swap(pool.begin(), it);
    }
    float sum = 0.0f;
    for (int k = 0; k < st.K; ++k) {
      pr.ids[static_cast<size_t>(t) * st.K + k] = pool[static_cast<size_t>(k)];
      sum += pr.weights[static_cast<size_t>(t) * st.K + k] = ud(rng);
    }
    for (int k = 0; k < st.K; ++k) pr.weights[static_cast<size_t>(t) * st.K + k] /= sum;
    if (st.on_input) pr.weights[static_cast<size_t>(t) * st.K] = ud(rng);
  }
  return pr;
}

inline ExpertsArgs args_of(const Problem& pr, bool on_input, float* out) {
  ExpertsArgs a;
  a.params = &pr.params;
  a.x = pr.x.data();
  a.T = pr.T;
  a.K = pr.K;
  a.topk_ids = pr.ids.data();
  a.topk_weights = pr.weights.data();
  a.router_weight_on_input = on_input;
  a.out = out;
  return a;
}

}  // namespace qmoe::cpu::test
