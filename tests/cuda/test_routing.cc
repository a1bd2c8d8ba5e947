// Device routing (route_device) against the CPU route() for every routing flavour the configs
// produce (softmax ± renormalisation, sigmoid + correction bias + grouped top-k + scaling,
// top-k-then-softmax), top-k = E, T = 1, many experts, bf16 / f16 logits, non-finite logits,
// determinism — on both device kernels (warp per token for E ≤ 1024 and n_group ≤ 32, block per
// token otherwise). Tolerance: ids identical (random normal logits have no fp32 score ties); weights
// within kWeightRel = 4e-6 relative (the device softmax denominator is summed in another order and
// expf differs from the host's by ≤ 2 ulps: a few ulps of fp32).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe::cuda::test {
namespace {

constexpr double kWeightRel = 4e-6;

#define SKIP_WITHOUT_GPU() \
  if (!qmoe::cuda::available()) GTEST_SKIP() << "no CUDA device"

struct Case {
  std::string name;
  RoutingConfig rc;
  int T, E, K;
  bool bias = false;
};

struct DevRun {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

DevRun run_device_routing(const Case& c, const std::vector<float>& logits, const std::vector<float>& bias, DType dt) {
  const size_t n = logits.size(), tk = static_cast<size_t>(c.T) * c.K;
  std::vector<uint16_t> l16(n);
  for (size_t i = 0; i < n; ++i) l16[i] = dt == DType::BF16 ? bf16_encode(logits[i]) : fp16_encode(logits[i]);
  void *dl = nullptr, *db = nullptr, *di = nullptr, *dw = nullptr;
  EXPECT_EQ(cudaMalloc(&dl, n * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&db, std::max<size_t>(bias.size(), 1) * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&di, tk * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dw, tk * 4), cudaSuccess);
  if (dt == DType::F32) EXPECT_EQ(cudaMemcpy(dl, logits.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  else EXPECT_EQ(cudaMemcpy(dl, l16.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  if (!bias.empty()) EXPECT_EQ(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  route_device(c.rc, dl, dt, c.T, c.E, c.K, bias.empty() ? nullptr : static_cast<float*>(db), static_cast<int32_t*>(di),
               static_cast<float*>(dw), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DevRun r;
  r.ids.resize(tk);
  r.w.resize(tk);
  EXPECT_EQ(cudaMemcpy(r.ids.data(), di, tk * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.w.data(), dw, tk * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (void* p : {dl, db, di, dw}) cudaFree(p);
  return r;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  RoutingConfig qwen;  // softmax, renormalise
  v.push_back({"qwen3_softmax_renorm", qwen, 37, 128, 8});
  v.push_back({"qwen3_T1", qwen, 1, 128, 8});
  RoutingConfig mix;
  mix.renormalize = false;
  v.push_back({"softmax_no_renorm", mix, 19, 8, 2});
  v.push_back({"topk_equals_E", qwen, 9, 16, 16});
  v.push_back({"many_experts", qwen, 5, 4096, 10});
  RoutingConfig ds;  // DeepSeek-V3
  ds.scoring = ScoringFunc::Sigmoid;
  ds.n_group = 8;
  ds.topk_group = 4;
  ds.has_correction_bias = true;
  ds.routed_scaling_factor = 2.5f;
  v.push_back({"deepseek_grouped_bias", ds, 41, 256, 8, true});
  RoutingConfig dsnb = ds;  // grouped, no bias: group score = max
  dsnb.has_correction_bias = false;
  dsnb.scoring = ScoringFunc::Softmax;
  v.push_back({"grouped_no_bias", dsnb, 23, 64, 6});
  RoutingConfig oss;  // gpt-oss
  oss.topk_then_softmax = true;
  v.push_back({"gpt_oss_topk_softmax", oss, 29, 128, 4});
  oss.has_correction_bias = true;
  v.push_back({"topk_softmax_bias_odd_E", oss, 7, 45, 5, true});
  // Block-per-token kernel (E > 1024 or n_group > 32) for the same flavours.
  v.push_back({"block_softmax_E1536", qwen, 6, 1536, 8});
  RoutingConfig many_groups = ds;
  many_groups.n_group = 64;
  many_groups.topk_group = 16;
  v.push_back({"block_grouped_64_groups", many_groups, 5, 512, 8, true});
  RoutingConfig big_groups = ds;  // warp kernel, groups of 100 experts spanning lanes
  big_groups.n_group = 10;
  big_groups.topk_group = 3;
  v.push_back({"warp_grouped_wide_groups", big_groups, 11, 1000, 12, true});
  return v;
}

void check_against_cpu(const Case& c, DType dt) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.E));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(c.T) * c.E), bias;
  for (auto& x : logits) {
    x = nd(rng);
    if (dt == DType::BF16) x = bf16_round(x);
    if (dt == DType::F16) x = fp16_decode(fp16_encode(x));
  }
  if (c.bias) {
    bias.resize(static_cast<size_t>(c.E));
    for (auto& b : bias) b = 0.1f * nd(rng);
  }
  std::vector<int32_t> ids(static_cast<size_t>(c.T) * c.K);
  std::vector<float> w(ids.size());
  route(c.rc, logits.data(), c.T, c.E, c.K, c.bias ? bias.data() : nullptr, ids.data(), w.data());
  const DevRun d = run_device_routing(c, logits, bias, dt);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(d.ids[i], ids[i]) << c.name << " " << dtype_name(dt) << " token " << i / c.K << " slot " << i % c.K;
    ASSERT_NEAR(d.w[i], w[i], kWeightRel * std::fabs(w[i]) + 1e-30)
        << c.name << " " << dtype_name(dt) << " token " << i / c.K << " slot " << i % c.K;
  }
  const DevRun again = run_device_routing(c, logits, bias, dt);
  EXPECT_EQ(0, std::memcmp(again.w.data(), d.w.data(), d.w.size() * 4)) << c.name << ": reruns differ";
}

TEST(CudaRouting, MatchesCpuRoute) {
  SKIP_WITHOUT_GPU();
  for (const auto& c : cases())
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) check_against_cpu(c, dt);
}

TEST(CudaRouting, NonFiniteLogitsGiveNaNWeights) {
  SKIP_WITHOUT_GPU();
  Case c{"nan", RoutingConfig{}, 3, 16, 4};
  std::vector<float> logits(static_cast<size_t>(c.T) * c.E, 0.5f);
  for (int e = 0; e < c.E; ++e) logits[static_cast<size_t>(e)] = static_cast<float>(e);
  logits[static_cast<size_t>(c.E + 5)] = NAN;
  logits[static_cast<size_t>(2 * c.E + 1)] = INFINITY;
  const DevRun d = run_device_routing(c, logits, {}, DType::F32);
  for (int k = 0; k < c.K; ++k) {
    EXPECT_FALSE(std::isnan(d.w[static_cast<size_t>(k)])) << "token 0 is finite";
    EXPECT_TRUE(std::isnan(d.w[static_cast<size_t>(c.K + k)])) << "token 1 has a NaN logit";
    EXPECT_TRUE(std::isnan(d.w[static_cast<size_t>(2 * c.K + k)])) << "token 2 has an Inf logit";
    EXPECT_GE(d.ids[static_cast<size_t>(c.K + k)], 0);
    EXPECT_LT(d.ids[static_cast<size_t>(c.K + k)], c.E);
  }
}

TEST(CudaRouting, ConfigErrorsBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  RoutingConfig rc;
  rc.n_group = 3;
  rc.topk_group = 2;
  EXPECT_THROW(route_device(rc, nullptr, DType::F32, 1, 8, 2, nullptr, nullptr, nullptr, nullptr), Error);
  RoutingConfig ok;
  EXPECT_THROW(route_device(ok, nullptr, DType::F32, 1, 8, 9, nullptr, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(route_device(ok, nullptr, DType::I8, 1, 8, 2, nullptr, nullptr, nullptr, nullptr), Error);
  RoutingConfig needs_bias;
  needs_bias.has_correction_bias = true;
  EXPECT_THROW(route_device(needs_bias, nullptr, DType::F32, 1, 8, 2, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace qmoe::cuda::test
