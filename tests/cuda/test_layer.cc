// CudaLayer (the whole layer on the device: router logits, device routing, routed and shared
// experts) against the host MoELayer and the conformance cases; the router-logits kernel against
// compute_router_logits; CUDA-graph capture and replay, streams, devices, determinism.
//
// Tolerances:
//  * ids: identical to the host's (random normal inputs have no fp32 score ties; the device logits
//    are fp64 sums rounded once, like the host's, in another order).
//  * logits: within 1 fp32 ulp of the host's (the fp64 sums of ≤ a few thousand fp32 products differ
//    by far less than an fp32 ulp, so only a near-tie of the final rounding can differ);
//  * routing weights: kWeightRel = 4e-6 relative, as test_routing.cc (device softmax order, expf);
//  * outputs: the conformance case's tolerance_rel_l2_fp32, or kExact = 1e-5 against the host
//    reference layer for a scheme with unquantized activations (test_experts.cc's reasoning).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "cpu/conformance_util.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dev_buffer.h"
#include "params_builder.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace qmoe::cuda::test {
namespace {

namespace fs = std::filesystem;

constexpr double kExact = 1e-5;
constexpr double kWeightRel = 4e-6;

#define SKIP_WITHOUT_GPU() \
  if (!qmoe::cuda::available()) GTEST_SKIP() << "no CUDA device"

struct DevOut {
  std::vector<float> out, w;
  std::vector<int32_t> ids;
};

// One eager call: x given as `xdt` (F32 values or BF16 bits), logits (F32) or null.
DevOut run_layer(const CudaLayer& L, const void* x, DType xdt, int T, const std::vector<float>* logits,
                 void* stream = nullptr) {
  const int H = L.hidden(), E = L.num_experts(), K = L.top_k();
  const size_t xb = static_cast<size_t>(T) * H * (xdt == DType::F32 ? 4 : 2);
  Dev dx(xb), dl(sizeof(float) * T * static_cast<size_t>(E)), dout(sizeof(float) * T * static_cast<size_t>(H)),
      di(sizeof(int32_t) * T * static_cast<size_t>(K)), dw(sizeof(float) * T * static_cast<size_t>(K));
  EXPECT_EQ(cudaMemcpy(dx.p, x, xb, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (logits) put(dl, *logits);
  L.run_device(dx.p, xdt, T, logits ? dl.p : nullptr, DType::F32, dout.as<float>(), di.as<int32_t>(), dw.as<float>(),
               stream);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DevOut r;
  r.out = get<float>(dout, static_cast<size_t>(T) * H);
  r.ids = get<int32_t>(di, static_cast<size_t>(T) * K);
  r.w = get<float>(dw, static_cast<size_t>(T) * K);
  return r;
}

void expect_weights_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], kWeightRel * std::fabs(want[i]) + 1e-30) << what << " weight " << i;
}

// ---- conformance cases -----------------------------------------------------------------------

double case_tolerance_fp32(const fs::path& dir) {
  std::ifstream f(dir / "case.json");
  return nlohmann::json::parse(f).value("tolerance_rel_l2_fp32", NAN);
}

class CudaLayerConformance : public ::testing::TestWithParam<std::string> {};

// The whole layer on the device from the case's hidden states (as stored: bf16), (a) with the
// case's router logits, (b) with the router weight: the case's routing and expected output.
TEST_P(CudaLayerConformance, WholeLayerMatchesExpected) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = fs::path(conformance::cases_dir()) / GetParam();
  const double tol32 = case_tolerance_fp32(dir);
  ASSERT_TRUE(std::isfinite(tol32));
  const auto io = SafetensorsFile::open((dir / "io.safetensors").string());
  const Tensor xt = io->get("hidden_states");
  const int T = static_cast<int>(xt.dim(0));
  const std::vector<float> expected = to_f32(io->get("expected"), "expected");
  const Tensor ids_t = io->get("topk_ids");
  const std::vector<int32_t> want_ids(ids_t.data_as<int32_t>(), ids_t.data_as<int32_t>() + ids_t.numel());
  const std::vector<float> want_w = to_f32(io->get("topk_weights"), "topk_weights");
  const MoELayer layer = MoELayer::from_checkpoint(dir.string(), 0);
  const CudaLayer L(layer);
  ASSERT_EQ(L.top_k(), static_cast<int>(ids_t.dim(1)));
  const std::vector<float> x32 = to_f32(xt, "hidden_states");
  const void* xp = xt.dtype() == DType::BF16 ? xt.data() : static_cast<const void*>(x32.data());
  const DType xdt = xt.dtype() == DType::BF16 ? DType::BF16 : DType::F32;

  if (io->find("router_logits")) {
    const std::vector<float> logits = to_f32(io->get("router_logits"), "router_logits");
    const DevOut r = run_layer(L, xp, xdt, T, &logits);
    EXPECT_EQ(r.ids, want_ids) << "given logits";
    expect_weights_near(r.w, want_w, "given logits");
    EXPECT_LE(rel_l2(r.out, expected), tol32) << "given logits";
    // The same values as fp32: the same output, bit for bit.
    if (xdt == DType::BF16) EXPECT_EQ(run_layer(L, x32.data(), DType::F32, T, &logits).out, r.out);
  }
  if (L.has_router()) {
    const DevOut r = run_layer(L, xp, xdt, T, nullptr);
    EXPECT_EQ(r.ids, want_ids) << "router on the device";
    expect_weights_near(r.w, want_w, "router on the device");
    EXPECT_LE(rel_l2(r.out, expected), tol32) << "router on the device";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLayerConformance, ::testing::ValuesIn(conformance::list_cases(false)),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaLayerConformance);

// ---- router logits kernel ----------------------------------------------------------------------

TEST(CudaRouterLogits, MatchesHostWithinOneUlp) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [T, H, E] : std::vector<std::array<int, 3>>{{1, 64, 8}, {7, 320, 128}, {33, 1100, 60}, {9, 2048, 1}}) {
    std::vector<float> x(static_cast<size_t>(T) * H), w(static_cast<size_t>(E) * H), b(E);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng) * 0.05f;
    for (auto& v : b) v = nd(rng);
    const Tensor wt = Tensor::from_f32(w, {E, H}), bt = Tensor::from_f32(b, {E});
    std::vector<float> want(static_cast<size_t>(T) * E);
    compute_router_logits(x.data(), T, H, wt, &bt, want.data());
    Dev dx(x.size() * 4), dw(w.size() * 4), db(b.size() * 4), dl(want.size() * 4), dx16(x.size() * 2);
    put(dx, x);
    put(dw, w);
    put(db, b);
    router_logits_device(dx.p, DType::F32, T, H, dw.as<float>(), db.as<float>(), E, false, dl.as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = get<float>(dl, want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), std::fabs(std::nextafter(want[i], INFINITY) - want[i]))
          << "T=" << T << " H=" << H << " E=" << E << " i=" << i;
    // bf16 / f16 inputs: the same as their fp32 values.
    for (DType dt : {DType::BF16, DType::F16}) {
      std::vector<uint16_t> x16(x.size());
      std::vector<float> xr(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x16[i] = dt == DType::BF16 ? bf16_encode(x[i]) : fp16_encode(x[i]);
        xr[i] = dt == DType::BF16 ? bf16_decode(x16[i]) : fp16_decode(x16[i]);
      }
      put(dx16, x16);
      put(dx, xr);
      Dev dl2(want.size() * 4);
      router_logits_device(dx16.p, dt, T, H, dw.as<float>(), db.as<float>(), E, false, dl.as<float>(), nullptr);
      router_logits_device(dx.p, DType::F32, T, H, dw.as<float>(), db.as<float>(), E, false, dl2.as<float>(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(get<float>(dl, want.size()), get<float>(dl2, want.size())) << dtype_name(dt);
    }
  }
}

// ---- synthetic layers with a shared expert -----------------------------------------------------

struct Synth {
  MoELayer layer;
  std::vector<float> x;
  int T;
};

// A Qwen2-MoE-like layer: routed experts of `scheme`, a shared expert (unquantized), router weight
// and bias, optionally a shared-expert gate; EP rank `ep_rank` of `ep_size`.
Synth synth_layer(const char* scheme, int T, bool gate, int ep_rank = 0, int ep_size = 1, uint64_t seed = 3) {
  const int E = 16, H = 320, I = 160, K = 4;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T) * H);
  for (auto& v : x) v = nd(rng);
  BuildSpec bs;
  bs.scheme = &scheme_by_name(scheme);
  bs.E = E;
  bs.H = H;
  bs.I = I;
  bs.seed = seed;
  if (ep_size > 1) bs.expert_map = ep_expert_map(E, ep_rank, ep_size);
  ExpertParams routed = build_params(bs, x, T);
  BuildSpec ss = bs;
  ss.scheme = &scheme_by_name("unquantized");
  ss.E = 1;
  ss.I = 96;
  ss.expert_map.clear();
  ExpertParams shared = build_params(ss, x, T);
  std::vector<float> rw(static_cast<size_t>(E) * H), rb(E), g(H);
  for (auto& v : rw) v = nd(rng) * 0.05f;
  for (auto& v : rb) v = nd(rng) * 0.1f;
  for (auto& v : g) v = nd(rng) * 0.05f;
  ModelConfig cfg;
  cfg.num_experts = E;
  cfg.hidden_size = H;
  cfg.top_k = K;
  cfg.shared_expert_intermediate_size = 96;
  MoELayerOptions opt;
  opt.kernel = Kernel::Reference;
  opt.load.ep_rank = ep_rank;
  opt.load.ep_size = ep_size;
  MoELayer layer(cfg, std::move(routed), std::move(shared), Tensor::from_f32(rw, {E, H}), Tensor::from_f32(rb, {E}),
                 Tensor{}, gate ? Tensor::from_f32(g, {H}) : Tensor{}, opt);
  return Synth{std::move(layer), std::move(x), T};
}

std::vector<float> host_run(const Synth& s, MoEWorkspace& ws) {
  std::vector<float> out(s.x.size());
  s.layer.plan_from_hidden(s.x.data(), s.T, ws);
  s.layer.run(s.x.data(), ws, out.data());
  return out;
}

TEST(CudaLayer, SharedExpertAndGateMatchHost) {
  SKIP_WITHOUT_GPU();
  for (bool gate : {false, true})
    for (int T : {1, 37, 130}) {
      const Synth s = synth_layer("w_mxfp4", T, gate);
      MoEWorkspace ws;
      const std::vector<float> want = host_run(s, ws);
      const CudaLayer L(s.layer);
      EXPECT_TRUE(L.has_shared_expert());
      const DevOut r = run_layer(L, s.x.data(), DType::F32, T, nullptr);
      EXPECT_EQ(r.ids, ws.topk_ids) << "gate=" << gate << " T=" << T;
      expect_weights_near(r.w, ws.topk_weights, "synthetic");
      EXPECT_LE(rel_l2(r.out, want), kExact) << "gate=" << gate << " T=" << T;
    }
}

// Each EP rank's device layer equals the host MoELayer of that rank (its routed experts, and the
// shared expert on rank 0 only). (The ranks' parameters are drawn per rank here, so they do not sum
// to one whole layer; the conformance cases' expected_ep2_rank* check the split itself.)
TEST(CudaLayer, ExpertParallelRanksMatchTheHostRanks) {
  SKIP_WITHOUT_GPU();
  const int T = 41;
  for (int rank = 0; rank < 2; ++rank) {
    const Synth part = synth_layer("w_mxfp4", T, true, rank, 2);
    const CudaLayer L(part.layer);
    EXPECT_EQ(L.has_shared_expert(), rank == 0);
    MoEWorkspace ws;
    const std::vector<float> want = host_run(part, ws);
    const DevOut r = run_layer(L, part.x.data(), DType::F32, T, nullptr);
    EXPECT_EQ(r.ids, ws.topk_ids) << "rank " << rank;
    EXPECT_LE(rel_l2(r.out, want), kExact) << "rank " << rank;
  }
}

// ---- graphs, streams, devices ------------------------------------------------------------------

TEST(CudaLayer, CapturedGraphReplaysTheEagerResult) {
  SKIP_WITHOUT_GPU();
  const int T = 24;
  const Synth s = synth_layer("w_mxfp4_a_mxfp4", T, true);
  CudaLayer L(s.layer);
  const int K = L.top_k();
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  Dev dx(s.x.size() * 4), dout(s.x.size() * 4), di(sizeof(int32_t) * T * K), dw(sizeof(float) * T * K);
  // Capturing before the buffers exist is refused with a clear error (and leaves the capture usable).
  cudaGraph_t g0 = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  try {
    L.run_device(dx.p, DType::F32, T, nullptr, DType::F32, dout.as<float>(), di.as<int32_t>(), dw.as<float>(), st);
    ADD_FAILURE() << "expected qmoe::Error for an unreserved capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capture"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(st, &g0), cudaSuccess);
  if (g0) cudaGraphDestroy(g0);

  L.reserve(T);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
  L.run_device(dx.p, DType::F32, T, nullptr, DType::F32, dout.as<float>(), di.as<int32_t>(), dw.as<float>(), st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Replays on two different inputs, each against the eager result on the same input.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<float> x(s.x.size());
    for (auto& v : x) v = nd(rng);
    put(dx, x);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const std::vector<float> got = get<float>(dout, x.size());
    const std::vector<int32_t> gids = get<int32_t>(di, static_cast<size_t>(T) * K);
    const DevOut eager = run_layer(L, x.data(), DType::F32, T, nullptr);
    EXPECT_EQ(got, eager.out) << "replay " << rep;
    EXPECT_EQ(gids, eager.ids) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST(CudaLayer, DeterministicAcrossStreamsAndCalls) {
  SKIP_WITHOUT_GPU();
  const Synth s = synth_layer("w_mxfp6_e3m2", 65, true);
  const CudaLayer L(s.layer);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  const DevOut a = run_layer(L, s.x.data(), DType::F32, s.T, nullptr);
  const DevOut b = run_layer(L, s.x.data(), DType::F32, s.T, nullptr, st);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.w, b.w);
  cudaStreamDestroy(st);
  // The calling thread's current device is left as it was.
  int dev = -1;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(dev, 0);
}

TEST(CudaLayer, ClearErrors) {
  SKIP_WITHOUT_GPU();
  const Synth s = synth_layer("w_mxfp4", 4, false);
  const CudaLayer L(s.layer);
  Dev d(4096);
  EXPECT_THROW(L.run_device(nullptr, DType::F32, 4, nullptr, DType::F32, d.as<float>(), d.as<int32_t>(),
                            d.as<float>(), nullptr),
               Error);
  EXPECT_THROW(L.run_device(d.p, DType::F32, 0, nullptr, DType::F32, d.as<float>(), d.as<int32_t>(), d.as<float>(),
                            nullptr),
               Error);
  EXPECT_THROW(L.run_device(d.p, DType::I32, 1, nullptr, DType::F32, d.as<float>(), d.as<int32_t>(), d.as<float>(),
                            nullptr),
               Error);
  CudaOptions o;
  o.device = device_count();
  EXPECT_THROW(CudaLayer(s.layer, o), Error);
}

}  // namespace
}  // namespace qmoe::cuda::test
