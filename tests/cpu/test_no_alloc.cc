// The optimized CPU layer allocates nothing per call once warmed up (issue 9: "nothing allocates
// per call on the hot path"): every operator new of the process is counted while the test's calls
// run — on the caller and on the pool's workers — after one warm-up call of the same shape has
// grown the per-thread scratch. This binary replaces the global operator new / delete to count
// (malloc / free underneath, so sanitizers see matching pairs); nothing else changes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "cpu/experts_optimized.h"
#include "cpu/kernel_iface.h"
#include "cpu/random_params.h"
#include "qmoe/config.h"
#include "qmoe/moe.h"
#include "qmoe/schemes.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_news{0};

void* counted_alloc(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace qmoe::cpu {
namespace {

struct Layer {
  ExpertParams params;
  std::vector<float> x, w, out;
  std::vector<int32_t> ids;
  int T = 0, K = 0;
  bool on_input = false;
};

Layer make_layer(const char* scheme, int T, int K, uint64_t seed, bool on_input = false) {
  Layer l;
  RandomExpertsSpec spec;
  spec.scheme = &scheme_by_name(scheme);
  spec.num_experts = 8;
  spec.hidden = 128;
  spec.inter = 64;
  spec.seed = seed;
  l.params = make_random_expert_params(spec);
  l.T = T;
  l.K = K;
  l.on_input = on_input;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  l.x.resize(static_cast<size_t>(T) * spec.hidden);
  for (float& v : l.x) v = nd(rng);
  l.out.assign(l.x.size(), 0.0f);
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      l.ids.push_back((t * 3 + k * 5) % spec.num_experts == (t * 3 + (k - 1) * 5) % spec.num_experts && k > 0
                          ? (t * 3 + k * 5 + 1) % spec.num_experts
                          : (t * 3 + k * 5) % spec.num_experts);
      l.w.push_back(1.0f / static_cast<float>(K));
    }
  return l;
}

ExpertsArgs args_of(Layer& l) {
  ExpertsArgs a;
  a.params = &l.params;
  a.x = l.x.data();
  a.T = l.T;
  a.K = l.K;
  a.topk_ids = l.ids.data();
  a.topk_weights = l.w.data();
  a.out = l.out.data();
  a.router_weight_on_input = l.on_input;
  return a;
}

// Every scheme family's kinds (F32, I8, Fp4Mx / Fp4Nv, Bf16 where the CPU has it), decode and
// prefill token counts, one and two threads.
TEST(OptimizedNoAlloc, NothingAllocatedPerCallAfterWarmUp) {
  for (const char* scheme : {"w_mxfp4_a_mxfp4", "w_mxfp4", "nvfp4", "w_int8_channel_a_int8_dyn_token",
                             "w_mxfp6_e2m3", "unquantized", "w_fp8_channel_a_fp8_dyn_token"})
    for (const int T : {1, 16, 300})
      for (const int threads : {1, 2}) {
        Layer l = make_layer(scheme, T, 2, 7);
        const ExpertsArgs a = args_of(l);
        experts_optimized_with(a, threads, {});  // warm-up: grows the scratch for this shape
        g_news = 0;
        g_counting = true;
        for (int r = 0; r < 3; ++r) experts_optimized_with(a, threads, {});
        g_counting = false;
        EXPECT_EQ(g_news.load(), 0) << scheme << " T=" << T << " threads=" << threads
                                    << ": operator new calls in 3 warmed-up calls";
      }
  // The routing weight applied to the input (top-1): its scaled copy of each row.
  for (const int threads : {1, 2}) {
    Layer l = make_layer("w_mxfp4_a_mxfp4", 40, 1, 9, true);
    const ExpertsArgs a = args_of(l);
    experts_optimized_with(a, threads, {});
    g_news = 0;
    g_counting = true;
    for (int r = 0; r < 3; ++r) experts_optimized_with(a, threads, {});
    g_counting = false;
    EXPECT_EQ(g_news.load(), 0) << "router weight on the input, threads=" << threads;
  }
}

// The whole layer through MoELayer: the router from hidden states, plan (top-k into the caller's
// workspace) and run with a gated shared expert, once its workspace has grown.
TEST(OptimizedNoAlloc, LayerPlanAndRunAllocateNothingAfterWarmUp) {
  const int E = 8, H = 128;
  RandomExpertsSpec spec;
  spec.scheme = &scheme_by_name("w_mxfp4_a_mxfp4");
  spec.num_experts = E;
  spec.hidden = H;
  spec.inter = 64;
  ModelConfig cfg;
  cfg.model_type = "qwen3_moe";
  cfg.top_k = 2;
  std::vector<float> rw(static_cast<size_t>(E) * H);
  for (size_t i = 0; i < rw.size(); ++i) rw[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
  RandomExpertsSpec shared_spec = spec;
  shared_spec.num_experts = 1;
  shared_spec.seed = 3;
  std::vector<float> gate(static_cast<size_t>(H));
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = 0.02f * static_cast<float>(static_cast<int>(i % 5) - 2);
  // With a shared expert and its sigmoid gate (run_shared).
  const MoELayer layer(cfg, make_random_expert_params(spec), make_random_expert_params(shared_spec),
                       Tensor::from_f32(rw, {E, H}), {}, {}, Tensor::from_f32(gate, {H}));
  ASSERT_TRUE(layer.shared_expert().has_value());
  for (const int T : {1, 16, 300}) {
    std::vector<float> x(static_cast<size_t>(T) * H), out(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(static_cast<int>(i % 17) - 8);
    MoEWorkspace ws;
    layer.plan_from_hidden(x.data(), T, ws);
    layer.run(x.data(), ws, out.data());
    g_news = 0;
    g_counting = true;
    for (int r = 0; r < 3; ++r) {
      layer.plan_from_hidden(x.data(), T, ws);
      layer.run(x.data(), ws, out.data());
    }
    g_counting = false;
    EXPECT_EQ(g_news.load(), 0) << "MoELayer plan_from_hidden + run, T=" << T;
  }
}

// The counter counts: a call with a new, larger shape grows the scratch (so a test that cannot
// see allocations would fail here).
TEST(OptimizedNoAlloc, CounterSeesAllocations) {
  g_news = 0;
  g_counting = true;
  std::vector<int>* v = new std::vector<int>(100);
  g_counting = false;
  delete v;
  EXPECT_GE(g_news.load(), 2);
}

}  // namespace
}  // namespace qmoe::cpu
