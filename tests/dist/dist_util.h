// Helpers of the distributed-layer tests (CPU tests/dist and the GPU tests/cuda): a conformance
// case's inputs, the rank-partials reference, the uneven token split and the per-rank threads.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/conformance_util.h"
#include "qmoe/config.h"
#include "qmoe/dist.h"
#include "qmoe/params.h"
#include "qmoe/safetensors.h"

namespace qmoe::dist::testing {

// The only difference between the two sides is the order of the fp32 sums over ranks (combine in
// rank order vs the test's world-rank order, the TP all-reduce), a few ulps per element.
inline constexpr double kSumOrderTol = 1e-6;

struct Case {
  std::string dir;
  int T = 0, H = 0, E = 0, K = 0;
  std::vector<float> hidden, logits, expected;
  double tol = 0;
  double tp2_tol = -1;  // the case's recorded tp2-sum-vs-expected error (per-slice semantics), if any
};

inline Case load_case(const std::string& name) {
  Case c;
  c.dir = conformance::cases_dir() + name;
  std::ifstream jf(c.dir + "/case.json");
  const nlohmann::json j = nlohmann::json::parse(jf);
  c.tol = j.at("tolerance_rel_l2_fp32").get<double>();
  if (j.contains("metrics") && j["metrics"].contains("tp2_sum_vs_expected_rel_l2"))
    c.tp2_tol = j["metrics"]["tp2_sum_vs_expected_rel_l2"].get<double>();
  const auto io = SafetensorsFile::open(c.dir + "/io.safetensors");
  const Tensor hs = io->get("hidden_states");
  c.T = static_cast<int>(hs.dim(0));
  c.H = static_cast<int>(hs.dim(1));
  c.hidden = to_f32(hs);
  const Tensor lg = io->get("router_logits");
  c.E = static_cast<int>(lg.dim(1));
  c.logits = to_f32(lg);
  c.expected = to_f32(io->get("expected"));
  return c;
}

// Σ over world ranks (in order) of MoELayer::run's partial outputs, and the routing. Each rank's
// static activation scales are those of all experts (as the distributed layer gathers them).
inline std::vector<float> sum_of_partials(const Case& c, const DistOptions& o, std::vector<int32_t>& ids) {
  std::vector<float> sum(c.expected.size(), 0.0f);
  const ModelConfig cfg = ModelConfig::load(c.dir);
  const ExpertParams all = load_expert_params(Checkpoint::open(c.dir), cfg, resolve_moe_scheme(cfg, 0), 0, {});
  for (int w = 0; w < o.ep * o.tp; ++w) {
    MoELayerOptions opt;
    opt.kernel = Kernel::Reference;
    opt.before_process = [&](ExpertParams& p) {
      if (!p.w13_input_scale.defined()) return;
      p.w13_input_scale = Tensor::from_f32(to_f32(all.w13_input_scale), {all.w13_input_scale.numel()});
      p.w2_input_scale = Tensor::from_f32(to_f32(all.w2_input_scale), {all.w2_input_scale.numel()});
    };
    opt.load.ep_rank = w / o.tp;
    opt.load.ep_size = o.ep;
    opt.load.tp_rank = w % o.tp;
    opt.load.tp_size = o.tp;
    const MoELayer layer = MoELayer::from_checkpoint(c.dir, 0, opt);
    MoEWorkspace ws;
    layer.plan(c.logits.data(), c.T, ws);
    ids = ws.topk_ids;
    std::vector<float> out(sum.size());
    layer.run(c.hidden.data(), ws, out.data());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
  }
  return sum;
}

// Tokens of EP rank e: a contiguous, deliberately uneven chunk (the last rank may get none).
inline std::pair<int, int> token_range(int T, int ep, int e) {
  if (ep == 1) return {0, T};
  const int first = (T + 1) / 2;  // rank 0 takes half, the rest share what remains
  if (e == 0) return {0, first};
  const int rest = T - first, per = (rest + ep - 2) / (ep - 1);
  const int b = std::min(T, first + (e - 1) * per), en = std::min(T, b + per);
  return {b, en};
}

struct DistRun {
  std::vector<float> out;
  std::vector<int32_t> ids;
};

// Runs every world rank of layout `o` on its own thread over groups from make_group(n); each rank's
// forward(ep_comm, tp_comm, x, logits, n, ws, out) computes its tokens (token_range).
template <class MakeGroup, class Forward>
DistRun run_distributed(const Case& c, const DistOptions& o, MakeGroup make_group, Forward forward) {
  const int world = o.ep * o.tp;
  // One group for each EP row (same tp rank) and each TP column (same ep rank).
  std::vector<std::vector<std::unique_ptr<Communicator>>> ep_groups, tp_groups;
  for (int t = 0; t < o.tp; ++t) ep_groups.push_back(make_group(o.ep));
  for (int e = 0; e < o.ep; ++e) tp_groups.push_back(make_group(o.tp));
  DistRun r;
  r.out.assign(c.expected.size(), 0.0f);
  r.ids.assign(static_cast<size_t>(c.T) * c.K, -1);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int w = 0; w < world; ++w) {
    threads.emplace_back([&, w] {
      try {
        const int e = w / o.tp, t = w % o.tp;
        const auto [b, en] = token_range(c.T, o.ep, e);
        const int n = en - b;
        std::vector<float> out(static_cast<size_t>(n) * c.H);
        MoEWorkspace ws;
        forward(*ep_groups[static_cast<size_t>(t)][static_cast<size_t>(e)],
                *tp_groups[static_cast<size_t>(e)][static_cast<size_t>(t)],
                n ? &c.hidden[static_cast<size_t>(b) * c.H] : nullptr,
                n ? &c.logits[static_cast<size_t>(b) * c.E] : nullptr, n, ws, out.data());
        if (t == 0) {  // every TP rank holds the same result; take TP rank 0's
          std::copy(out.begin(), out.end(), r.out.begin() + static_cast<ptrdiff_t>(b) * c.H);
          std::copy(ws.topk_ids.begin(), ws.topk_ids.end(), r.ids.begin() + static_cast<ptrdiff_t>(b) * c.K);
        }
      } catch (const std::exception& ex) {
        errors[static_cast<size_t>(w)] = ex.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int w = 0; w < world; ++w) EXPECT_EQ(errors[static_cast<size_t>(w)], "") << "rank " << w;
  return r;
}

// The layouts every case runs: EP 2 both ways, TP 2, EP 2 × TP 2, and EP 3 (an uneven split of the
// experts and of the tokens, one rank possibly without tokens) where E allows.
inline std::vector<DistOptions> test_layouts(const Case& c) {
  std::vector<DistOptions> l = {{2, 1, ExpertDispatch::AllToAll}, {2, 1, ExpertDispatch::AllGather},
                                {1, 2, ExpertDispatch::AllToAll}, {2, 2, ExpertDispatch::AllToAll}};
  if (c.E >= 3) l.push_back({3, 1, ExpertDispatch::AllToAll});
  return l;
}

inline std::string layout_name(const std::string& case_name, const DistOptions& o) {
  return fmt::format("{} ep {} tp {} {}", case_name, o.ep, o.tp,
                     o.dispatch == ExpertDispatch::AllToAll ? "all-to-all" : "all-gather");
}

// gtest parameter names from case directory names.
inline std::string case_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// The CPU layer on the in-process group, reference kernel.
inline DistRun run_distributed_cpu(const Case& c, const DistOptions& o) {
  return run_distributed(c, o, [](int n) { return make_in_process_group(n); },
                         [&](Communicator& ep, Communicator& tp, const float* x, const float* lg, int n,
                             MoEWorkspace& ws, float* out) {
                           MoELayerOptions base;
                           base.kernel = Kernel::Reference;
                           DistributedMoE layer(c.dir, 0, ep, tp, o, base);
                           layer.forward(x, lg, n, ws, out);
                         });
}

}  // namespace qmoe::dist::testing
