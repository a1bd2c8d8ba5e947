// The CUDA experts against the CPU oracle experts_reference, for every registry scheme and
// activation, edge cases, launch-configuration variants, and determinism.
//
// Tolerances (rel-L2 of the layer output, and per token row):
//  * kExact = 1e-5: every scheme in the default (fp32-accurate) mode. The kernels differ from the
//    reference only by fp32 instead of fp64 accumulation (~1e-7 relative) and by fp32 instead of
//    double activation functions; weight-only schemes feed fp32 activations as bf16 hi + lo
//    (≤ 2^-17 relative per element).
//  * Grid flips: a scheme that quantizes the intermediate can land an element on the other side of
//    a rounding boundary when its fp32 value differs from the reference's by an ulp; that moves one
//    token row by up to a grid step (fp4: ~1/sqrt(I) of the row). We allow at most T/16 such rows
//    (none for T < 16); all other rows must stay within kRow = 5e-5 of the RMS row norm (the hi + lo
//    split alone gives up to ~1.2e-5 on a row), the whole output within kExact unless rows flipped,
//    and a systematic error fails every row.
//  * kBf16 = 1e-2: CudaOptions::bf16_activations (activations and intermediate rounded to bf16
//    once, rel. error 2^-9 per element — vLLM's precision) and CudaOptions::fp8_mma (fp8 MMA sums
//    with ~13 fraction bits, so FP8 requantization of the intermediate flips some grid points).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "cuda/cuda_common.h"  // set_align_debug_delay_ns
#include "dev_buffer.h"
#include "params_builder.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe::cuda::test {
namespace {

constexpr double kExact = 1e-5;
constexpr double kRow = 5e-5;  // per token row (a grid flip moves a row by ≥ ~1e-4)
constexpr double kBf16 = 1e-2;

#define SKIP_WITHOUT_GPU() \
  if (!qmoe::cuda::available()) GTEST_SKIP() << "no CUDA device"

bool small() { return std::getenv("QMOE_TEST_SMALL") != nullptr; }

struct Problem {
  int T = 33, K = 2, E = 8, H = 320, I = 160;
  std::vector<int> expert_map;  // empty: identity
  ActivationSpec act;
  bool bias = true;
  bool on_input = false;
  uint64_t seed = 1;
  std::vector<int> allowed;           // routing pool (empty: all experts)
  std::vector<int32_t> forced_ids;    // overrides random routing
};

// The activation kernels' problems: T tokens, top-2 of 4 experts, H = 128, intermediate size I;
// `interleaved`: gpt-oss's interleaved gate / up rows with swigluoai and its limit of 7, else SiLU
// over gate / up halves.
Problem gate_up_problem(int T, int I, bool interleaved) {
  Problem pb;
  pb.T = T;
  pb.K = 2;
  pb.E = 4;
  pb.H = 128;
  pb.I = I;
  if (interleaved) {
    pb.act.kind = Activation::SwigluOai;
    pb.act.interleaved = true;
    pb.act.limit = 7.0f;
  }
  return pb;
}

struct Result {
  std::vector<float> gpu, ref;
  double rel = 0.0;
  int rows_over = 0;
  double worst_row = 0.0;
};

BuildSpec spec_of(const SchemeInfo& s, const Problem& pb) {
  BuildSpec b;
  b.scheme = &s;
  b.E = pb.E;
  b.H = pb.H;
  b.I = pb.I;
  b.expert_map = pb.expert_map;
  b.act = pb.act;
  b.bias = pb.bias;
  b.seed = pb.seed;
  return b;
}

// One problem's inputs, parameters, routing and reference output, made once for any number of GPU
// runs (run_prepared).
struct Prepared {
  Problem pb;
  std::vector<float> x;
  ExpertParams p;
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<float> init, ref;  // the output before the layer adds into it (prefill: random), after
  ExpertsArgs args(float* out) const {
    ExpertsArgs a;
    a.params = &p;
    a.x = x.data();
    a.T = pb.T;
    a.K = pb.K;
    a.topk_ids = ids.data();
    a.topk_weights = w.data();
    a.router_weight_on_input = pb.on_input;
    a.out = out;
    return a;
  }
};

Prepared prepare(const SchemeInfo& s, const Problem& pb, bool prefill = false) {
  Prepared pr;
  pr.pb = pb;
  std::mt19937 rng(static_cast<uint32_t>(pb.seed * 7919 + 17));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  pr.x.resize(static_cast<size_t>(pb.T) * pb.H);
  for (auto& v : pr.x) v = nd(rng);
  pr.p = build_params(spec_of(s, pb), pr.x, pb.T);
  random_routing(pb.T, pb.K, pb.E, rng, pr.ids, pr.w, pb.allowed);
  if (!pb.forced_ids.empty()) pr.ids = pb.forced_ids;
  pr.init.assign(pr.x.size(), 0.0f);
  if (prefill)
    for (auto& v : pr.init) v = nd(rng);
  pr.ref = pr.init;
  experts_reference(pr.args(pr.ref.data()));
  return pr;
}

// The GPU layer on a prepared problem, against its reference.
Result run_prepared(const Prepared& pr, const CudaOptions& opt = {}) {
  const Problem& pb = pr.pb;
  Result r;
  r.ref = pr.ref;
  r.gpu = pr.init;
  experts_cuda(pr.args(r.gpu.data()), opt);
  r.rel = rel_l2(r.gpu, r.ref);
  // Per-row error relative to the RMS row norm of the reference (rows of tokens routed to no
  // local expert are zero in both).
  double tot = 0.0;
  for (float v : r.ref) tot += static_cast<double>(v) * v;
  const double rms_row = std::sqrt(tot / pb.T) + 1e-30;
  for (int t = 0; t < pb.T; ++t) {
    double d = 0.0;
    for (int h = 0; h < pb.H; ++h) {
      const size_t k = static_cast<size_t>(t) * pb.H + h;
      const double e = std::isfinite(r.gpu[k]) ? static_cast<double>(r.gpu[k]) - r.ref[k] : INFINITY;
      d += e * e;
    }
    const double row = std::sqrt(d) / rms_row;
    r.worst_row = std::max(r.worst_row, row);
    if (row > kRow) ++r.rows_over;
  }
  return r;
}

Result run_problem(const SchemeInfo& s, const Problem& pb, const CudaOptions& opt = {}, bool prefill = false) {
  return run_prepared(prepare(s, pb, prefill), opt);
}

void expect_exact(const SchemeInfo& s, const Result& r, int T, const std::string& what) {
  const int allowed_flips = act_is_quantized(s.act) ? T / 16 : 0;
  EXPECT_LE(r.rows_over, allowed_flips) << what << ": " << r.rows_over << " token rows over " << kRow
                                        << " (worst " << r.worst_row << ", overall rel-L2 " << r.rel << ")";
  if (allowed_flips == 0) EXPECT_LE(r.rel, kExact) << what;
  EXPECT_TRUE(std::isfinite(r.rel)) << what;
}

ActivationSpec make_act(Activation k) {
  ActivationSpec a;
  a.kind = k;
  if (k == Activation::SwigluOai) {
    a.interleaved = true;
    a.limit = 7.0f;
    a.alpha = 1.702f;
  }
  return a;
}

// ---- every scheme × activation -----------------------------------------------------------------
struct SchemeAct {
  const SchemeInfo* s;
  Activation a;
};
std::vector<SchemeAct> all_scheme_acts() {
  std::vector<SchemeAct> v;
  for (const auto& s : all_schemes())
    for (Activation a : {Activation::Silu, Activation::Gelu, Activation::GeluTanh, Activation::SwigluOai})
      v.push_back({&s, a});
  return v;
}
std::string sa_name(const ::testing::TestParamInfo<SchemeAct>& i) {
  return std::string(i.param.s->name) + "_" + std::string(to_string(i.param.a));
}

class CudaExpertsAll : public ::testing::TestWithParam<SchemeAct> {};
TEST_P(CudaExpertsAll, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [s, a] = GetParam();
  Problem pb;
  pb.act = make_act(a);
  pb.seed = 3;
  const Result r = run_problem(*s, pb);
  expect_exact(*s, r, pb.T, std::string(s->name));
}
INSTANTIATE_TEST_SUITE_P(Registry, CudaExpertsAll, ::testing::ValuesIn(all_scheme_acts()), sa_name);

// ---- bf16 activation mode (weight-only schemes) -------------------------------------------------
TEST(CudaExperts, Bf16ActivationsMode) {
  SKIP_WITHOUT_GPU();
  for (const char* n : {"unquantized", "w_mxfp4", "w_mxfp6_e2m3", "w_mxfp6_e3m2"}) {
    const SchemeInfo& s = scheme_by_name(n);
    Problem pb;
    CudaOptions o;
    o.bf16_activations = true;
    const Result r = run_problem(s, pb, o);
    EXPECT_LE(r.rel, kBf16) << n;
    EXPECT_GT(r.rel, 1e-5) << n << ": bf16 mode should differ from the exact path by bf16 rounding";
  }
}

// ---- FP8 W8A8 on the e4m3 tensor cores (CudaOptions::fp8_mma) ------------------------------------
// Token tiles of 64 / 128 (forced and chosen), K splits, ragged and empty experts, an odd number of
// weight tiles (N = 640, 576) and K padded to the stage (H = 576, I = 320). The products are exact
// but the fp8 MMA adds them with ~13 fraction bits, and an intermediate element that lands on the
// other side of an FP8 rounding boundary moves by a grid step: vLLM's precision class, held to
// kBf16. The output must differ from the fp32-accurate path (else the e4m3 kernel did not run)
// and repeat bit for bit.
TEST(CudaExperts, Fp8TensorCoreMode) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : all_schemes()) {
    if (s.weight != WeightFormat::Fp8E4M3) continue;
    struct Case {
      int T, tile, ks;
      std::vector<int> allowed;
    };
    std::vector<Case> cases = {{300, 64, 0, {}}, {300, 128, 0, {}}, {300, 128, 3, {}},
                               {600, 0, 0, {}},  {300, 0, 0, {0, 2}}, {257, 0, 0, {3}}};
    if (small()) cases = {{140, 64, 3, {}}, {140, 128, 0, {1, 2}}};  // under compute-sanitizer
    for (const Case& c : cases) {
      Problem pb;
      pb.T = c.T;
      pb.E = 4;
      pb.H = 576;
      pb.I = 320;
      pb.allowed = c.allowed;
      if (c.allowed.size() == 1) pb.K = 1;  // every token on one expert
      CudaOptions o;
      o.token_tile = c.tile;
      o.ksplit = c.ks;
      const Result exact = run_problem(s, pb, o);
      o.fp8_mma = true;
      for (int kernel = 0; kernel <= 2; ++kernel) {  // gemm_wg_f8_kernel, gemm_ws_f8_kernel with 1 / 2 tiles
        o.fp8_kernel = kernel;
        const Result r = run_problem(s, pb, o), again = run_problem(s, pb, o);
        const std::string what = std::string(s.name) + " T=" + std::to_string(c.T) + " tile " + std::to_string(c.tile) +
                                 " ks " + std::to_string(c.ks) + " experts " + std::to_string(c.allowed.size()) +
                                 " kernel " + std::to_string(kernel);
        std::printf("[ fp8_mma  ] %s: rel-L2 %.3e (fp32-accurate path %.3e)\n", what.c_str(), r.rel, exact.rel);
        EXPECT_LE(r.rel, kBf16) << what;
        EXPECT_TRUE(std::isfinite(r.rel)) << what;
        EXPECT_NE(0, std::memcmp(r.gpu.data(), exact.gpu.data(), r.gpu.size() * sizeof(float)))
            << what << ": identical to the fp32-accurate path — the e4m3 kernel did not run";
        EXPECT_EQ(0, std::memcmp(r.gpu.data(), again.gpu.data(), r.gpu.size() * sizeof(float))) << what << ": rerun";
      }
    }
  }
}

// An fp8_kernel outside -1 … 2, or a QMOE_CUDA_F8 value it does not know, is an error naming the choices.
TEST(CudaExperts, Fp8KernelChoiceIsChecked) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name("w_fp8_tensor_a_fp8_static");
  ActivationSpec act;
  CudaOptions o;
  o.fp8_mma = true;
  o.fp8_kernel = 3;
  EXPECT_THROW(CudaExperts::random(s, 2, 256, 128, act, 1, o), Error);
  o.fp8_kernel = 2;
  EXPECT_NO_THROW(CudaExperts::random(s, 2, 256, 128, act, 1, o));
}

// ---- edge cases -----------------------------------------------------------------------------
const char* kEdgeSchemes[] = {"unquantized",   "w_mxfp4",         "w_mxfp4_a_mxfp4",
                              "nvfp4",         "w_int8_channel_a_int8_dyn_token", "w_fp8_tensor_a_fp8_dyn_tensor",
                              "w_mxfp6_e3m2_a_mxfp6_e3m2", "w_mxfp4_a_fp8", "w_int8_tensor_a_int8_static"};

class CudaExpertsEdge : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaExpertsEdge, SingleToken) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.T = 1;
  expect_exact(s, run_problem(s, pb), pb.T, "T=1");
}
TEST_P(CudaExpertsEdge, ExpertWithNoTokens) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.allowed = {0, 1, 2, 4, 5, 6, 7};  // expert 3 gets nothing
  expect_exact(s, run_problem(s, pb), pb.T, "expert 3 empty");
}
TEST_P(CudaExpertsEdge, AllTokensOnOneExpert) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.T = 150;
  pb.K = 1;
  pb.forced_ids.assign(150, 5);  // 150 slots on expert 5: several tiles of one expert
  expect_exact(s, run_problem(s, pb), pb.T, "all on expert 5");
}
// Up to kWarpAlignSlots (32) slots take the one-warp align (moe_kernels.cu align_warp), more the
// block-wide one: both sides of the bound, with an expert-parallel map (slots on other ranks),
// every slot on one expert, top-k = E and duplicate-free random routing.
TEST_P(CudaExpertsEdge, FewSlotsAlignedByOneWarp) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  for (const int T : {1, 3, 16, 17}) {
    Problem pb;
    pb.T = T;
    pb.K = 2;
    pb.seed = 40 + static_cast<uint64_t>(T);
    expect_exact(s, run_problem(s, pb), pb.T, "T = " + std::to_string(T) + ", K = 2");
    pb.expert_map = {-1, -1, 0, 1, 2, 3, -1, -1};
    expect_exact(s, run_problem(s, pb), pb.T, "T = " + std::to_string(T) + ", EP map");
  }
  Problem one;
  one.T = 32;
  one.K = 1;
  one.forced_ids.assign(32, 6);  // 32 slots on expert 6: the tiles of one expert
  expect_exact(s, run_problem(s, one), one.T, "32 slots on expert 6");
  Problem all;
  all.T = 4;
  all.E = 8;
  all.K = 8;  // top-k = E: 32 slots, 4 on every expert
  expect_exact(s, run_problem(s, all), all.T, "T = 4, top-k = E = 8");
}
TEST_P(CudaExpertsEdge, TopKEqualsE) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.E = 4;
  pb.K = 4;
  expect_exact(s, run_problem(s, pb), pb.T, "top-k = E");
}
TEST_P(CudaExpertsEdge, OddSizes) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  const int blk = weight_block_size(s.weight);
  if (blk == 0) {
    pb.H = 100;
    pb.I = 52;
  } else if (blk == 16) {
    pb.H = 48;
    pb.I = 80;
  } else {
    pb.H = 96;
    pb.I = 224;
  }
  pb.T = 19;
  pb.E = 5;
  pb.K = 3;
  expect_exact(s, run_problem(s, pb), pb.T, "odd sizes");
  if (blk == 0) {  // I % 4 != 0: partial-row groups of the activation kernel
    pb.I = 50;
    expect_exact(s, run_problem(s, pb), pb.T, "odd sizes, I = 50");
  }
}
TEST_P(CudaExpertsEdge, ExpertParallelMissingExperts) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.expert_map = {-1, -1, 0, 1, 2, 3, -1, -1};  // this rank holds global experts 2..5
  const Result r = run_problem(s, pb);
  expect_exact(s, r, pb.T, "EP map");
}
TEST_P(CudaExpertsEdge, RouterWeightOnInput) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.K = 1;
  pb.on_input = true;
  expect_exact(s, run_problem(s, pb), pb.T, "router weight on input");
}
TEST_P(CudaExpertsEdge, AccumulatesIntoOut) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  expect_exact(s, run_problem(s, pb, {}, /*prefill=*/true), pb.T, "accumulate");
}
TEST_P(CudaExpertsEdge, TilesAndSplits) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.T = 70;
  pb.E = 4;
  pb.H = 512;
  pb.I = 256;
  for (int bt : {8, 16, 32, 64, 128})
    for (int ks : {1, 3, 16}) {
      CudaOptions o;
      o.token_tile = bt;
      o.ksplit = ks;
      expect_exact(s, run_problem(s, pb, o), pb.T, "token_tile " + std::to_string(bt) + " ksplit " + std::to_string(ks));
    }
}
// Hidden states handed over as BF16 / F16 (engines' dtypes): the same output, bit for bit, as
// the fp32 input holding the same values (the BF16 path also drops GEMM1's lo MMA).
TEST_P(CudaExpertsEdge, Bf16AndF16InputsEqualF32OfTheSameValues) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(pb.T) * pb.H);
  for (auto& v : x) v = nd(rng);
  pb.seed = 3;
  const ExpertParams p = build_params(spec_of(s, pb), x, pb.T);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(pb.T, pb.K, pb.E, rng, ids, w, {});
  CudaExperts ce(p, {});
  ce.reserve(pb.T, pb.K);
  const size_t n = x.size();
  void *dx16 = nullptr, *dx32 = nullptr, *dids = nullptr, *dw = nullptr, *da = nullptr, *db = nullptr;
  ASSERT_EQ(cudaMalloc(&dx16, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dx32, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dids, ids.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&da, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (const DType dt : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> x16(n);
    std::vector<float> xr(n);
    for (size_t i = 0; i < n; ++i) {
      x16[i] = dt == DType::BF16 ? bf16_encode(x[i]) : fp16_encode(x[i]);
      xr[i] = dt == DType::BF16 ? bf16_decode(x16[i]) : fp16_decode(x16[i]);
    }
    ASSERT_EQ(cudaMemcpy(dx16, x16.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx32, xr.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ce.run_device(dx16, dt, pb.T, pb.K, static_cast<int32_t*>(dids), static_cast<float*>(dw), static_cast<float*>(da),
                  false, false, nullptr);
    ce.run_device(static_cast<const float*>(dx32), pb.T, pb.K, static_cast<int32_t*>(dids), static_cast<float*>(dw),
                  static_cast<float*>(db), false, false, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> a(n), bb(n);
    ASSERT_EQ(cudaMemcpy(a.data(), da, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(bb.data(), db, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(0, std::memcmp(a.data(), bb.data(), n * 4)) << GetParam() << " " << dtype_name(dt);
    double norm = 0;
    for (float v : a) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 0.0) << "the output was written";
  }
  EXPECT_THROW(ce.run_device(dx16, DType::I8, pb.T, pb.K, static_cast<int32_t*>(dids), static_cast<float*>(dw),
                             static_cast<float*>(da), false, false, nullptr),
               Error);
  for (void* q : {dx16, dx32, dids, dw, da, db}) cudaFree(q);
}
// Random hidden states (normal, seed `seed`), the scheme's parameters built from them and random
// routing drawn after them from the same generator.
struct RandomLayerInput {
  std::vector<float> x;
  ExpertParams params;
  std::vector<int32_t> ids;
  std::vector<float> w;
};
RandomLayerInput random_layer_input(const SchemeInfo& s, const Problem& pb, uint32_t seed) {
  RandomLayerInput r;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  r.x.resize(static_cast<size_t>(pb.T) * pb.H);
  for (auto& v : r.x) v = nd(rng);
  r.params = build_params(spec_of(s, pb), r.x, pb.T);
  random_routing(pb.T, pb.K, pb.E, rng, r.ids, r.w, {});
  return r;
}

// At prefill combine writes 4 outputs per thread with 16-byte accesses when the output pointer
// allows it and one otherwise: an output 4 bytes off alignment gives the same bits, written over
// and accumulated into (T = 600: past kPrefillRows, src/cuda/moe_kernels.cu).
TEST_P(CudaExpertsEdge, UnalignedOutputMatchesAligned) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  pb.T = 600;
  const RandomLayerInput in = random_layer_input(s, pb, 5);
  const std::vector<float>& x = in.x;
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<float>& w = in.w;
  CudaExperts ce(in.params, {});
  ce.reserve(pb.T, pb.K);
  const size_t n = x.size();
  const Dev dx(n * 4), dids(ids.size() * 4), dw(w.size() * 4), da(n * 4), db((n + 1) * 4);
  ASSERT_NO_FATAL_FAILURE(put(dx, x));
  ASSERT_NO_FATAL_FAILURE(put(dids, ids));
  ASSERT_NO_FATAL_FAILURE(put(dw, w));
  float* out_a = da.as<float>();
  float* out_b = db.as<float>() + 1;  // 4 bytes past a 16-byte boundary
  std::vector<float> init(n);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : init) v = nd(rng);
  for (const bool acc : {false, true}) {
    ASSERT_NO_FATAL_FAILURE(put(out_a, init));
    ASSERT_NO_FATAL_FAILURE(put(out_b, init));
    ce.run_device(dx.as<float>(), pb.T, pb.K, dids.as<int32_t>(), dw.as<float>(), out_a, false, acc, nullptr);
    ce.run_device(dx.as<float>(), pb.T, pb.K, dids.as<int32_t>(), dw.as<float>(), out_b, false, acc, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> a = get<float>(out_a, n), b = get<float>(out_b, n);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * 4)) << GetParam() << " accumulate " << acc;
    EXPECT_NE(0, std::memcmp(a.data(), init.data(), n * 4)) << "the output was written";
  }
}
// Non-finite hidden states on the unchecked device path (docs/DECISIONS.md): the affected tokens'
// rows are NaN, every other row is bit-identical to the run with those rows zeroed; both with
// the routing weight applied after the experts and on the input, accumulating or not.
TEST_P(CudaExpertsEdge, NonFiniteDeviceInputsGiveNaNRows) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  // T = 40 and 4: align fused with the input quantization (launch_prep) at both; T = 4 has a
  // single 8-token tile per expert.
  for (const int T : {40, 4})
  for (const bool on_input : {false, true}) {
    Problem pb;
    pb.T = T;
    pb.K = on_input ? 1 : 2;
    const RandomLayerInput in = random_layer_input(s, pb, 5);
    const std::vector<float>& x = in.x;
    const ExpertParams& p = in.params;
    const std::vector<int32_t>& ids = in.ids;
    const std::vector<float>& w = in.w;
    const int mid = pb.T > 8 ? 7 : 1;
    const std::vector<int> bad_rows = {0, mid, pb.T - 1};
    std::vector<float> xbad = x, xzero = x;
    xbad[0 * pb.H + 5] = NAN;
    xbad[static_cast<size_t>(mid) * pb.H + 0] = INFINITY;
    xbad[static_cast<size_t>(pb.T) * pb.H - 1] = -INFINITY;
    for (int t : bad_rows) std::fill_n(xzero.begin() + static_cast<size_t>(t) * pb.H, pb.H, 0.0f);
    CudaExperts ce(p, {});
    ce.reserve(pb.T, pb.K);
    const size_t n = x.size();
    const Dev dx(n * 4), dids(ids.size() * 4), dw(w.size() * 4), da(n * 4), db(n * 4);
    ASSERT_NO_FATAL_FAILURE(put(dids, ids));
    ASSERT_NO_FATAL_FAILURE(put(dw, w));
    for (const bool acc : {false, true}) {
      ASSERT_EQ(cudaMemset(da.p, 0, n * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(db.p, 0, n * 4), cudaSuccess);
      ASSERT_NO_FATAL_FAILURE(put(dx, xbad));
      ce.run_device(dx.as<float>(), pb.T, pb.K, dids.as<int32_t>(), dw.as<float>(), da.as<float>(), on_input, acc, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_NO_FATAL_FAILURE(put(dx, xzero));
      ce.run_device(dx.as<float>(), pb.T, pb.K, dids.as<int32_t>(), dw.as<float>(), db.as<float>(), on_input, acc, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> a = get<float>(da, n), b = get<float>(db, n);
      const std::string what = std::string(GetParam()) + " T=" + std::to_string(pb.T) + (on_input ? " on_input" : "") +
                               (acc ? " accumulate" : "");
      for (int t = 0; t < pb.T; ++t) {
        const bool is_bad = std::find(bad_rows.begin(), bad_rows.end(), t) != bad_rows.end();
        const float* ra = a.data() + static_cast<size_t>(t) * pb.H;
        const float* rb = b.data() + static_cast<size_t>(t) * pb.H;
        if (is_bad) {
          EXPECT_TRUE(std::all_of(ra, ra + pb.H, [](float v) { return std::isnan(v); })) << what << " row " << t;
        } else {
          EXPECT_EQ(0, std::memcmp(ra, rb, sizeof(float) * pb.H)) << what << " row " << t;
          EXPECT_TRUE(std::all_of(ra, ra + pb.H, [](float v) { return std::isfinite(v); })) << what << " row " << t;
        }
      }
    }
  }
}
// Decode with long intermediate rows: act_kernel splits each row over several blocks (act_chunk in
// moe_kernels.cu, ≥ 1024 columns each; the per-token dynamic modes keep whole rows) — I = 3072
// (three chunks of 1024) and 2080 (1056 + 1024), 1 and 3 tokens, gate / up halves and interleaved
// (gpt-oss) with swigluoai's limit.
TEST_P(CudaExpertsEdge, DecodeSplitsLongIntermediateRows) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  for (const int I : {3072, 2080})
    for (const int T : {1, 3})
      for (const bool interleaved : {false, true}) {
        const Problem pb = gate_up_problem(T, I, interleaved);
        const std::string what = "I=" + std::to_string(I) + " T=" + std::to_string(T) + (interleaved ? " interleaved" : "");
        expect_exact(s, run_problem(s, pb), pb.T, what);
      }
}
// The activation kernel past kPrefillRows (T·K = 600): 4 features per thread where I % 4 == 0,
// one where not (I = 50, schemes without weight blocks), both gate / up layouts, with biases.
TEST_P(CudaExpertsEdge, PrefillActivationLayouts) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  std::vector<int> sizes = {320};
  if (weight_block_size(s.weight) == 0) sizes.push_back(50);
  for (const int I : sizes)
    for (const bool interleaved : {false, true}) {
      const Problem pb = gate_up_problem(300, I, interleaved);
      expect_exact(s, run_problem(s, pb), pb.T, "I=" + std::to_string(I) + (interleaved ? " interleaved" : ""));
    }
}
TEST_P(CudaExpertsEdge, Deterministic) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name(GetParam());
  Problem pb;
  const Result a = run_problem(s, pb), b = run_problem(s, pb);
  EXPECT_EQ(0, std::memcmp(a.gpu.data(), b.gpu.data(), a.gpu.size() * sizeof(float)));
}
INSTANTIATE_TEST_SUITE_P(Schemes, CudaExpertsEdge, ::testing::ValuesIn(kEdgeSchemes),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// ---- larger problems (BT = 128 tiles, many tiles per expert) ------------------------------------
// A layer wider than one fp32 row in a block's shared memory (H = 65536: 256 KB > the H200's
// 227 KB) is refused at construction with the limit named, not by a failed launch later.
TEST(CudaExperts, RefusesRowsWiderThanSharedMemory) {
  SKIP_WITHOUT_GPU();
  try {
    (void)CudaExperts::random(scheme_by_name("unquantized"), 2, 65536, 64, ActivationSpec{}, 1, {});
    FAIL() << "expected an error for H = 65536";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too wide"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("H=65536"), std::string::npos) << e.what();
  }
}

// The activation kernel's many-groups-per-thread forms (8 waves of resident threads on a 132-SM
// H200: T·K · I / 4 = 8192 · 272 groups), both gate / up layouts: I = 1088 (272 groups a row)
// takes 3 groups per thread (96 threads, 16 slots idle against 112 with 4), I = 1280 (320) 4.
TEST(CudaExperts, PrefillActivationManyRows) {
  SKIP_WITHOUT_GPU();
  if (small()) GTEST_SKIP() << "QMOE_TEST_SMALL";
  for (const int I : {1088, 1280})
    for (const char* n : {"w_mxfp4_a_mxfp4", "nvfp4", "w_mxfp4"}) {
      const SchemeInfo& s = scheme_by_name(n);
      Problem pb = gate_up_problem(4096, I, true);
      pb.act.interleaved = std::string(n) != "nvfp4";  // swigluoai over gate / up halves for NVFP4
      expect_exact(s, run_problem(s, pb), pb.T, std::string(n) + " I=" + std::to_string(I));
    }
}

TEST(CudaExperts, LargerPrefill) {
  SKIP_WITHOUT_GPU();
  for (const char* n : {"w_mxfp4_a_mxfp4", "w_int8_channel_a_int8_dyn_token", "unquantized", "nvfp4"}) {
    const SchemeInfo& s = scheme_by_name(n);
    Problem pb;
    pb.T = small() ? 200 : 600;
    pb.H = 512;
    pb.I = 384;
    expect_exact(s, run_problem(s, pb), pb.T, n);
  }
}

// ---- decode at a model's hidden size --------------------------------------------------------------
// The fused prep kernel's shared memory (align's static arrays + the row) passes the 48 KB default
// from H ≈ 1800: mixtral's and deepseek's H, at 1, 3 and 40 tokens.
TEST(CudaExperts, DecodeAtModelHiddenSizes) {
  SKIP_WITHOUT_GPU();
  for (const char* n : {"w_mxfp4_a_mxfp4", "unquantized"})
    for (int H : {4096, 7168})
      for (int T : {1, 3, 40}) {
        const SchemeInfo& s = scheme_by_name(n);
        Problem pb;
        pb.T = T;
        pb.H = H;
        pb.I = 128;
        expect_exact(s, run_problem(s, pb), pb.T, std::string(n) + " H=" + std::to_string(H) + " T=" + std::to_string(T));
      }
}

// ---- 32-, 64- and 128-token tiles on both kernels (wgmma on Hopper, mma.sync), every scheme -------
// Ragged tiles (~150 tokens per expert: full and partial tiles of every size), an odd number of
// 128-row weight tiles in both GEMMs (N = 640 and 576: the wgmma kernel's second warpgroup idles
// on the last one) and K padded to the stage (I = 320).
TEST(CudaExperts, WgmmaTilesEveryScheme) {
  SKIP_WITHOUT_GPU();
  for (const auto& s : all_schemes()) {
    Problem pb;
    pb.T = small() ? 140 : 300;
    pb.E = 4;
    pb.H = 576;
    pb.I = 320;
    for (int bt : {32, 64, 128})
      for (bool wg : {true, false}) {
        CudaOptions o;
        o.token_tile = bt;
        o.wgmma = wg;
        expect_exact(s, run_problem(s, pb, o), pb.T,
                     std::string(s.name) + " tile " + std::to_string(bt) + (wg ? " wgmma" : " mma.sync"));
      }
    // 64- and 128-token tiles with the activation tiles by TMA on both GEMMs (GEMM1's operand
    // gathered into tile order; by default only from 2I >= 4096, past this problem) and with none.
    for (int bt : {64, 128})
      for (int tma : {2, 0}) {
        CudaOptions o;
        o.token_tile = bt;
        o.tma = tma;
        expect_exact(s, run_problem(s, pb, o), pb.T,
                     std::string(s.name) + " tile " + std::to_string(bt) + " wgmma tma " + std::to_string(tma));
      }
  }
}

// Top-1 routing with counts[e] tokens on expert e (H = 576, I = 320), the slots shuffled.
Problem tokens_per_expert(const std::vector<int>& counts, uint32_t shuffle_seed) {
  Problem pb;
  pb.K = 1;
  pb.E = static_cast<int>(counts.size());
  pb.H = 576;
  pb.I = 320;
  pb.T = 0;
  for (int e = 0; e < pb.E; ++e) {
    for (int i = 0; i < counts[static_cast<size_t>(e)]; ++i) pb.forced_ids.push_back(e);
    pb.T += counts[static_cast<size_t>(e)];
  }
  std::shuffle(pb.forced_ids.begin(), pb.forced_ids.end(), std::mt19937(shuffle_seed));
  return pb;
}

// The wgmma kernels narrow a tile's MMAs to its tokens rounded up to 32 (wg_fit_n): experts of
// 20 … 128 tokens put 64- and 128-token tiles in every width (32, 64, 96, 128), each width's rows
// more than the T / 16 rows that quantized activations may flip, on both wgmma kernels (tma 0:
// gemm_wg_kernel; the default: gemm_ws_kernel where its TMA is built).
TEST(CudaExperts, MmaWidthFollowsTileTokens) {
  SKIP_WITHOUT_GPU();
  const Problem pb = tokens_per_expert({20, 31, 33, 64, 65, 96, 97, 128}, 5);
  for (const auto& s : all_schemes())
    for (int bt : {64, 128})
      for (int tma : {0, 1}) {
        CudaOptions o;
        o.token_tile = bt;
        o.tma = tma;
        expect_exact(s, run_problem(s, pb, o), pb.T,
                     std::string(s.name) + " tile " + std::to_string(bt) + " tma " + std::to_string(tma));
      }
}

// The persistent warp-specialised kernels (CudaOptions::persist) loop over the classic grid's work
// items; their output must be the one-CTA-per-item output bit for bit. persist = 3 makes each CTA
// take many items on this small problem — empty and one-token experts, partial tiles, K splits, and
// an odd weight-tile count (2I = 640: five 128-row tiles of GEMM1, so one consumer warpgroup idles on
// every third item) — and persist = 1 is the default (one CTA per SM). TMA 2 puts both GEMMs on the
// warp-specialised kernel for every format it is built for; TMA 0 keeps it where it is the default
// without TMA (bf16 weights, hi + lo); FP8 runs its e4m3 kernels with one and two weight tiles.
TEST(CudaExperts, PersistentKernelsMatchOneCtaPerItem) {
  SKIP_WITHOUT_GPU();
  const Problem pb = tokens_per_expert({0, 1, 63, 64, 65, 129, 200, 7}, 11);
  int compared = 0;
  for (const auto& s : all_schemes()) {
    if (small() && std::string(s.name) != "w_mxfp4_a_mxfp4" && std::string(s.name) != "unquantized" &&
        std::string(s.name) != "w_fp8_tensor_a_fp8_static")
      continue;  // under compute-sanitizer: one register-decode, one shared-memory-operand, the e4m3 kernels
    const Prepared pr = prepare(s, pb);
    const bool fp8 = s.weight == WeightFormat::Fp8E4M3;
    for (int bt : {64, 128})
      for (int tma : {2, 0})
        for (int ks : {0, 3})
          for (int f8k : fp8 ? std::vector<int>{0, 1, 2} : std::vector<int>{0}) {
            CudaOptions o;
            o.token_tile = bt;
            o.tma = tma;
            o.ksplit = ks;
            if (f8k > 0) {
              o.fp8_mma = true;
              o.fp8_kernel = f8k;
            }
            const std::string what = std::string(s.name) + " tile " + std::to_string(bt) + " tma " + std::to_string(tma) +
                                     " ksplit " + std::to_string(ks) + (f8k ? " e4m3 ws" + std::to_string(f8k) : "");
            o.persist = 0;
            const Result one = run_prepared(pr, o);
            for (int persist : {3, 1}) {
              o.persist = persist;
              const Result got = run_prepared(pr, o);
              EXPECT_EQ(0, std::memcmp(got.gpu.data(), one.gpu.data(), got.gpu.size() * sizeof(float)))
                  << what << ": persist " << persist << " differs from one CTA per item";
              ++compared;
            }
            if (f8k > 0) EXPECT_LE(one.rel, kBf16) << what;  // Fp8TensorCoreMode's bound (the e4m3 MMA's sums)
            else expect_exact(s, one, pb.T, what);
          }
  }
  EXPECT_GT(compared, 0);
}

// Every kernel that reads align's outputs must wait for align (launch.cuh's contract). With align
// held back for 200 µs after it lets its dependants start, a GEMM that read the tile lists before
// its own wait would read a fresh layer's zeros (no tiles) and leave its output unwritten, as
// GEMM1 did after a quant_input beside align (bench/RESULTS.md 2026-12-06, session 38). T = 40
// takes the fused prep, T = 600 quant_input beside align; tma 2 puts a gather before GEMM1; the
// tensor-wide FP8 scale puts absmax between align and quant_input.
// On an H100 (2026-12-06, session 39) it passed with that fix reverted too: the card did not start
// GEMM1 while align, two grids back, was still running, although quant_input had let it. So there
// it guards the documented model (a grid's dependants may start once it has triggered), which other
// cards, drivers or the sanitizers (where session 38 saw the race) need not tighten the same way.
TEST(CudaExperts, KernelsAfterAlignWaitForIt) {
  SKIP_WITHOUT_GPU();
  struct Delay {
    Delay() { set_align_debug_delay_ns(200000); }
    ~Delay() { set_align_debug_delay_ns(0); }
  } delay;
  for (const char* name : {"w_mxfp4_a_mxfp4", "unquantized", "w_int8_channel_a_int8_dyn_token", "w_fp8_tensor_a_fp8_dyn_tensor"}) {
    const SchemeInfo& s = scheme_by_name(name);
    for (int T : {40, 600})
      for (int tma : {0, 2}) {
        Problem pb;
        pb.T = T;
        pb.K = 2;
        pb.E = 8;
        pb.H = 256;
        pb.I = 128;
        CudaOptions o;
        o.tma = tma;
        expect_exact(s, run_problem(s, pb, o), pb.T,
                     std::string(name) + " T " + std::to_string(T) + " tma " + std::to_string(tma) + " (align delayed)");
      }
  }
}

// ---- errors -------------------------------------------------------------------------------------
TEST(CudaExperts, RejectsBadInput) {
  SKIP_WITHOUT_GPU();
  const SchemeInfo& s = scheme_by_name("w_mxfp4");
  std::vector<float> x(256 * 4, 0.5f);
  BuildSpec b;
  b.scheme = &s;
  b.H = 256;
  b.I = 128;
  ExpertParams p = build_params(b, x, 4);
  std::vector<int32_t> ids = {0, 9, 1, 2, 3, 4, 5, 6};  // 9 ≥ E
  std::vector<float> w(8, 0.5f), out(256 * 4, 0.0f);
  ExpertsArgs a;
  a.params = &p;
  a.x = x.data();
  a.T = 4;
  a.K = 2;
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.out = out.data();
  EXPECT_THROW(experts_cuda(a), Error);
  ids[1] = 1;
  a.router_weight_on_input = true;  // needs K == 1
  EXPECT_THROW(experts_cuda(a), Error);
  a.router_weight_on_input = false;
  ExpertParams bad = p;
  bad.processed = false;
  a.params = &bad;
  EXPECT_THROW(experts_cuda(a), Error);
  bad = p;
  bad.w13_weight_scale = Tensor::zeros(DType::U8, {8, 256, 3});
  EXPECT_THROW(experts_cuda(a), Error);
}

}  // namespace
}  // namespace qmoe::cuda::test
