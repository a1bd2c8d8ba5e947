// The distributed layer on the GPU (qmoe/cuda_dist.h). The n-rank device algorithm runs on this one
// GPU over the in-process device group (the test double: device copies, host sums) and must equal
// the CPU DistributedMoE on the same layout within the case's tolerance (the same bound as the CUDA
// conformance test: CUDA experts vs the fp64 reference), route identically and rerun bit for bit.
// NCCL itself is exercised with a one-rank communicator (this machine has one GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "dist/dist_util.h"
#include "qmoe/cuda.h"
#include "qmoe/cuda_dist.h"
#include "qmoe/error.h"

namespace qmoe::cuda {
namespace {

using conformance::rel_l2;
using namespace qmoe::dist;
using namespace qmoe::dist::testing;

DistRun run_distributed_gpu(const Case& c, const DistOptions& o, bool nccl = false) {
  return run_distributed(
      c, o,
      [nccl](int n) {
        return nccl ? nccl_communicators(std::vector<int>(static_cast<size_t>(n), 0)) : device_in_process_group(n);
      },
      [&](Communicator& ep, Communicator& tp, const float* x, const float* lg, int n, MoEWorkspace& ws, float* out) {
        CudaDistributedMoE layer(c.dir, 0, ep, tp, o);
        layer.forward_host(x, lg, n, ws, out);
      });
}

class CudaDist : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDist, DeviceLayoutsMatchTheCpuLayer) {
  Case c = load_case(GetParam());
  c.K = MoELayer::from_checkpoint(c.dir, 0).config().top_k;
  for (const DistOptions& o : test_layouts(c)) {
    const std::string what = layout_name(GetParam(), o);
    DistRun cpu;
    try {
      std::vector<int32_t> ids;
      (void)sum_of_partials(c, o, ids);  // a layout the sizes do not allow is skipped, as on the CPU
    } catch (const Error& e) {
      std::cout << "[ dist ] " << what << ": layout refused: " << e.what() << "\n";
      continue;
    }
    cpu = run_distributed_cpu(c, o);
    const DistRun gpu = run_distributed_gpu(c, o);
    EXPECT_EQ(gpu.ids, cpu.ids) << what;
    const double e = rel_l2(gpu.out, cpu.out), e_exp = rel_l2(gpu.out, c.expected);
    std::cout << "[ dist ] " << what << ": GPU vs CPU layer rel_l2 " << e << ", vs expected " << e_exp << "\n";
    EXPECT_LE(e, c.tol) << what;
    if (o.tp == 1) EXPECT_LE(e_exp, c.tol) << what;
    const DistRun again = run_distributed_gpu(c, o);
    EXPECT_EQ(again.out, gpu.out) << what << ": rerun not bit-identical";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDist, ::testing::ValuesIn(conformance::list_cases(false)),
                         case_param_name);
// No cases on this machine (../shared absent, none carried): scripts/gpu_check.sh warns, the suite runs none.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaDist);

TEST(CudaDistNccl, OneRankCommunicatorMovesAndSums) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  auto comms = nccl_communicators({0});
  Communicator& c = *comms[0];
  EXPECT_EQ(c.size(), 1);
  EXPECT_TRUE(c.device_memory());
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * 64 * sizeof(float)), cudaSuccess);
  std::vector<float> h(64);
  for (int i = 0; i < 64; ++i) h[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
  ASSERT_EQ(cudaMemcpy(d, h.data(), 64 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const size_t off = 0, bytes = 64 * sizeof(float), roff = 64 * sizeof(float);
  c.all_to_all_v(d, &off, &bytes, d, &roff, &bytes, nullptr);
  c.all_reduce_sum(d + 64, 64, nullptr);
  std::vector<float> back(64);
  ASSERT_EQ(cudaMemcpy(back.data(), d + 64, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
  const int64_t cs = 7;
  int64_t cr = 0;
  c.exchange_counts(&cs, &cr, nullptr);
  EXPECT_EQ(cr, 7);
  const double v = 3.25;
  double g = 0;
  c.all_gather_host(&v, sizeof(v), &g);
  EXPECT_EQ(g, 3.25);
  cudaFree(d);
}

TEST(CudaDistNccl, OneRankLayerEqualsTheSingleGpuExperts) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  for (const std::string& name : conformance::list_cases(false)) {
    Case c = load_case(name);
    const MoELayer solo = MoELayer::from_checkpoint(c.dir, 0);
    if (solo.shared_expert()) continue;  // the single-GPU side below is the routed experts alone
    c.K = solo.config().top_k;
    const DistRun got = run_distributed_gpu(c, DistOptions{1, 1, ExpertDispatch::AllToAll}, /*nccl=*/true);
    MoEWorkspace ws;
    solo.plan(c.logits.data(), c.T, ws);
    std::vector<float> want(c.expected.size(), 0.0f);
    ExpertsArgs a;
    a.params = &solo.experts();
    a.x = c.hidden.data();
    a.T = c.T;
    a.K = c.K;
    a.topk_ids = ws.topk_ids.data();
    a.topk_weights = ws.topk_weights.data();
    a.router_weight_on_input = solo.config().routing.apply_router_weight_on_input;
    a.out = want.data();
    CudaExperts(solo.experts()).run_host(a);
    EXPECT_EQ(got.out, want) << name;
  }
}

}  // namespace
}  // namespace qmoe::cuda
