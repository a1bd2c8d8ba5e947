// The optimized CPU layer allocates nothing per call once warmed up (issue 9: "nothing allocates
// per call on the hot path"): every operator new of the process is counted while the test's calls
// run — on the caller and on the pool's workers — after one warm-up call of the same shape has
// grown the per-thread scratch. This binary replaces the global operator new / delete to count
// (malloc / free underneath, so sanitizers see matching pairs); nothing else changes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "cpu/experts_optimized.h"
#include "cpu/optimized_problem.h"
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

using test::Case;

// operator new calls made by f().
template <class F>
long allocations_in(F&& f) {
  g_news = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_news.load();
}

// Three calls of one problem after a warm-up call of the same shape (which grows the scratch).
long allocations_per_3_calls(const char* scheme, const Case& c, int threads) {
  const test::Problem pr = test::make_problem(scheme_by_name(scheme), "silu", c, 7);
  std::vector<float> out(pr.x.size(), 0.0f);
  const ExpertsArgs a = test::args_of(pr, c.on_input, out.data());
  experts_optimized_with(a, threads, {});
  return allocations_in([&] {
    for (int r = 0; r < 3; ++r) experts_optimized_with(a, threads, {});
  });
}

// Every scheme family's kinds (F32, I8, Fp4Mx / Fp4Nv, Bf16 where the CPU has it), decode and
// prefill token counts, one and two threads; and the routing weight applied to the input (top-1:
// a scaled copy of each row).
TEST(OptimizedNoAlloc, NothingAllocatedPerCallAfterWarmUp) {
  for (const char* scheme : {"w_mxfp4_a_mxfp4", "w_mxfp4", "nvfp4", "w_int8_channel_a_int8_dyn_token",
                             "w_mxfp6_e2m3", "unquantized", "w_fp8_channel_a_fp8_dyn_token"})
    for (const int T : {1, 16, 300})
      for (const int threads : {1, 2})
        EXPECT_EQ(allocations_per_3_calls(scheme, Case{"", 8, 128, 64, 2, T, test::Routing::Uniform, {}, false}, threads), 0)
            << scheme << " T=" << T << " threads=" << threads << ": operator new calls in 3 warmed-up calls";
  for (const int threads : {1, 2}) {
    const Case on_input{"", 8, 128, 64, 1, 40, test::Routing::Uniform, {}, true};
    EXPECT_EQ(allocations_per_3_calls("w_mxfp4_a_mxfp4", on_input, threads), 0)
        << "router weight on the input, threads=" << threads;
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
    auto call = [&] {
      layer.plan_from_hidden(x.data(), T, ws);
      layer.run(x.data(), ws, out.data());
    };
    call();
    EXPECT_EQ(allocations_in([&] {
                for (int r = 0; r < 3; ++r) call();
              }),
              0)
        << "MoELayer plan_from_hidden + run, T=" << T;
  }
}

// The counter counts (a vector made with new: two allocations), so the tests above can fail.
TEST(OptimizedNoAlloc, CounterSeesAllocations) {
  std::vector<int>* v = nullptr;
  EXPECT_GE(allocations_in([&] { v = new std::vector<int>(100); }), 2);
  delete v;
}

}  // namespace
}  // namespace qmoe::cpu
