// MoELayer::plan: routing into the workspace, then the slots (t·K + k) grouped by local expert
// (counts, offsets, sorted_slots; slots of non-local experts are left out).
#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "moe/router_logits.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

void MoELayer::plan(const float* router_logits, int T, MoEWorkspace& ws) const {
  if (T < 1) throw Error(fmt::format("plan: token count T = {} must be at least 1", T));
  if (router_logits == nullptr) throw Error("plan: router_logits is null");
  const int E = experts_.num_experts, K = cfg_.top_k;
  if (E != cfg_.num_experts)
    throw Error(fmt::format("plan: the layer's experts have E = {} but config.json says num_experts = {}", E,
                            cfg_.num_experts));
  if (static_cast<int64_t>(T) * K > INT32_MAX)
    throw Error(fmt::format("plan: T = {} tokens x top_k = {} routing slots exceed the limit of {} per call; split "
                            "the batch",
                            T, K, INT32_MAX));
  check_finite_rows(router_logits, T, E, "router_logits", "plan");
  ws.T = T;
  ws.K = K;
  ws.topk_ids.assign(static_cast<size_t>(T) * K, 0);
  ws.topk_weights.assign(static_cast<size_t>(T) * K, 0.0f);
  route(cfg_.routing, router_logits, T, E, K, correction_bias_f32_.empty() ? nullptr : correction_bias_f32_.data(),
        ws.topk_ids.data(), ws.topk_weights.data());

  const int el = experts_.num_local;
  ws.counts.assign(static_cast<size_t>(el), 0);
  for (int32_t id : ws.topk_ids) {
    const int l = experts_.expert_map[static_cast<size_t>(id)];
    if (l >= 0) ++ws.counts[static_cast<size_t>(l)];
  }
  ws.offsets.assign(static_cast<size_t>(el) + 1, 0);
  for (int e = 0; e < el; ++e)
    ws.offsets[static_cast<size_t>(e) + 1] = ws.offsets[static_cast<size_t>(e)] + ws.counts[static_cast<size_t>(e)];
  ws.sorted_slots.assign(static_cast<size_t>(ws.offsets[static_cast<size_t>(el)]), 0);
  thread_local std::vector<int32_t> fill;  // grown only: no allocation per call once warmed up
  fill.assign(ws.offsets.begin(), ws.offsets.end() - 1);
  for (int32_t s = 0; s < T * K; ++s) {
    const int l = experts_.expert_map[static_cast<size_t>(ws.topk_ids[static_cast<size_t>(s)])];
    if (l >= 0) ws.sorted_slots[static_cast<size_t>(fill[static_cast<size_t>(l)]++)] = s;
  }
}

void MoELayer::plan_from_hidden(const float* x, int T, MoEWorkspace& ws) const {
  if (!has_router())
    throw Error(fmt::format("plan_from_hidden: layer has no router weight ({}); pass router logits to plan()",
                            cfg_.dir.empty() ? std::string("built in memory") : cfg_.dir));
  if (T < 1) throw Error(fmt::format("plan_from_hidden: token count T = {} must be at least 1", T));
  if (x == nullptr) throw Error("plan_from_hidden: hidden states are null");
  // Before the router: NaN / Inf in the input is reported as such, not as bad router logits.
  check_finite_rows(x, T, experts_.hidden, "hidden_states", "plan_from_hidden");
  // The optimized experts' helper threads start waking now and are spinning by the time run()
  // opens its region (the router and routing take ~15 µs at decode).
  if (opt_.kernel != Kernel::Reference && !opt_.runner) cpu::ThreadPool::instance().prewake(opt_.threads);
  const int64_t E = router_weight_.dim(0);
  thread_local std::vector<float> logits;  // grown only
  logits.resize(static_cast<size_t>(T) * static_cast<size_t>(E));
  if (opt_.kernel == Kernel::Reference && !opt_.runner)  // the reference layer: the reference's loop
    compute_router_logits(x, T, experts_.hidden, router_weight_, router_bias_.defined() ? &router_bias_ : nullptr,
                          logits.data());
  else
    detail::router_logits_f32(x, T, experts_.hidden, router_weight_f32_.data(), E,
                              router_bias_f32_.empty() ? nullptr : router_bias_f32_.data(), logits.data());
  plan(logits.data(), T, ws);
}

}  // namespace qmoe
