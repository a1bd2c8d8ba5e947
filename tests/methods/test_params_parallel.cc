// Tensor parallelism (intermediate slices, §7.2; gpt-oss block rule §7.5; w2 bias on rank 0 only)
// and expert parallelism (contiguous split with remainder, explicit expert maps; non-local experts
// are not read) on synthetic checkpoints.
#include <gtest/gtest.h>

#include <functional>

#include "error_of.h"
#include "methods_test_util.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "synthetic_model.h"

namespace qmoe::test {
namespace {

LoadOptions tp(int r, int n) {
  LoadOptions o;
  o.tp_rank = r;
  o.tp_size = n;
  return o;
}
LoadOptions ep(int r, int n) {
  LoadOptions o;
  o.ep_rank = r;
  o.ep_size = n;
  return o;
}

// Rank r's dequant must equal the rows / columns [start, start + I_p) of the unsliced dequant.
void expect_tp_slices(const SyntheticModel& m, int tp_size, const std::vector<int64_t>& expect_inter) {
  const ExpertParams full = m.load();
  const int64_t H = full.hidden, I = full.inter;
  int64_t start = 0;
  for (int r = 0; r < tp_size; ++r) {
    SCOPED_TRACE("tp rank " + std::to_string(r));
    ExpertParams p = m.load(tp(r, tp_size));
    ASSERT_EQ(p.inter, expect_inter[static_cast<size_t>(r)]);
    EXPECT_EQ(p.inter_full, I);
    const int64_t Ip = p.inter;
    for (int e = 0; e < full.num_local; ++e) {
      std::vector<float> f13, f2, w13, w2;
      dequant_expert(full, e, f13, f2);
      dequant_expert(p, e, w13, w2);
      std::vector<float> want13, want2;
      if (p.act.interleaved) {
        want13.assign(f13.begin() + 2 * start * H, f13.begin() + 2 * (start + Ip) * H);
      } else {
        for (int half = 0; half < 2; ++half)
          want13.insert(want13.end(), f13.begin() + (half * I + start) * H, f13.begin() + (half * I + start + Ip) * H);
      }
      for (int64_t h = 0; h < H; ++h) want2.insert(want2.end(), f2.begin() + h * I + start, f2.begin() + h * I + start + Ip);
      EXPECT_TRUE(same_values(w13, want13, "w13 expert " + std::to_string(e)));
      EXPECT_TRUE(same_values(w2, want2, "w2 expert " + std::to_string(e)));
      if (p.w13_bias.defined()) {
        const float* b = p.w13_bias.data_as<float>() + e * 2 * Ip;
        const float* fb = full.w13_bias.data_as<float>() + e * 2 * I;
        if (p.act.interleaved) {
          EXPECT_TRUE(same_values(b, fb + 2 * start, static_cast<size_t>(2 * Ip), "w13 bias"));
        }
        const float* b2 = p.w2_bias.data_as<float>() + e * H;
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(b2[h], r == 0 ? full.w2_bias.data_as<float>()[e * H + h] : 0.0f) << "w2 bias h=" << h;
        }
      }
    }
    start += Ip;
  }
  EXPECT_EQ(start, I);
}

TEST(TensorParallel, EvenSplitForEveryScheme) {
  for (const SchemeInfo& s : all_schemes()) {
    SCOPED_TRACE(std::string(s.name));
    SyntheticModel m(std::string(s.name), ExpertNaming::GateUpDown, 2, 64, 128, false, 3);
    expect_tp_slices(m, 2, {64, 64});
    expect_tp_slices(m, 4, {32, 32, 32, 32});
  }
}

TEST(TensorParallel, GptOssMxfp4CeilRuleWithBiases) {
  // I = 96 = 3 blocks of 32: tp 2 → per_rank = ceil(3/2)·32 = 64: rank 0 [0, 64), rank 1 [64, 96).
  SyntheticModel m("w_mxfp4", ExpertNaming::GptOss, 2, 64, 96, true, 5);
  expect_tp_slices(m, 2, {64, 32});
  // tp 4 → per_rank 32: ranks 0..2 own a block each, rank 3 gets nothing.
  EXPECT_NO_THROW(m.load(tp(2, 4)));
  const std::string msg = error_of([&] { m.load(tp(3, 4)); });
  EXPECT_NE(msg.find("gets no part"), std::string::npos) << msg;
}

TEST(TensorParallel, GptOssUnquantizedEvenSplit) {
  SyntheticModel m("unquantized", ExpertNaming::GptOss, 2, 16, 12, true, 6);
  expect_tp_slices(m, 2, {6, 6});
  expect_tp_slices(m, 3, {4, 4, 4});
}

TEST(TensorParallel, SliceErrors) {
  SyntheticModel mx("w_mxfp4", ExpertNaming::GateUpDown, 2, 64, 64);
  std::string msg = error_of([&] { mx.load(tp(0, 4)); });  // I_p = 16 < MX block
  EXPECT_NE(msg.find("I_p=16 is not a multiple of the MX block size 32"), std::string::npos) << msg;
  msg = error_of([&] { mx.load(tp(0, 3)); });
  EXPECT_NE(msg.find("not divisible by tp_size 3"), std::string::npos) << msg;
  SyntheticModel nv("nvfp4", ExpertNaming::GateUpDown, 2, 64, 48);
  msg = error_of([&] { nv.load(tp(1, 2)); });  // I_p = 24, not a multiple of 16
  EXPECT_NE(msg.find("NVFP4 block size 16"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { mx.load(tp(2, 2)); }).find("tp_rank 2 is out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { mx.load(tp(0, 0)); }).find("tp_size must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { mx.load(tp(-1, 2)); }).find("out of range"), std::string::npos);
}

TEST(ExpertParallel, ContiguousSplitWithRemainder) {
  SyntheticModel m("w_mxfp4_a_mxfp4", ExpertNaming::GateUpDown, 5, 64, 32);
  const ExpertParams full = m.load();
  const std::vector<std::vector<int>> want2 = {{0, 1, 2}, {3, 4}}, want3 = {{0, 1}, {2, 3}, {4}};
  for (const auto& [n, want] : {std::pair{2, want2}, std::pair{3, want3}}) {
    for (int r = 0; r < n; ++r) {
      ExpertParams p = m.load(ep(r, n));
      EXPECT_EQ(p.local_to_global, want[static_cast<size_t>(r)]);
      EXPECT_EQ(p.num_experts, 5);
      for (int l = 0; l < p.num_local; ++l) {
        const int g = p.local_to_global[static_cast<size_t>(l)];
        EXPECT_EQ(p.expert_map[static_cast<size_t>(g)], l);
        std::vector<float> a13, a2, b13, b2;
        dequant_expert(p, l, a13, a2);
        dequant_expert(full, g, b13, b2);
        EXPECT_TRUE(same_values(a13, b13, "w13 of global expert " + std::to_string(g)));
        EXPECT_TRUE(same_values(a2, b2, "w2 of global expert " + std::to_string(g)));
      }
    }
  }
  EXPECT_NE(error_of([&] { m.load(ep(0, 6)); }).find("larger than the number of experts"), std::string::npos);
  EXPECT_NE(error_of([&] { m.load(ep(2, 2)); }).find("ep_rank 2 is out of range"), std::string::npos);
}

TEST(ExpertParallel, ExplicitMapLoadsOnlyLocalExperts) {
  SyntheticModel m("nvfp4", ExpertNaming::GateUpDown, 4, 64, 32);
  const ExpertParams full = m.load();
  // Experts 0 and 2 are not on this rank: their tensors are not even required.
  SyntheticModel partial = m;
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
    for (int e : {0, 2})
      for (const char* s : {"weight", "weight_scale", "weight_scale_2", "input_scale_2"})
        partial.erase(m.base(e, proj) + "." + s);
  LoadOptions o;
  o.expert_map = {-1, 1, -1, 0};
  ExpertParams p = partial.load(o);
  EXPECT_EQ(p.num_local, 2);
  EXPECT_EQ(p.local_to_global, (std::vector<int>{3, 1}));
  for (int l = 0; l < 2; ++l) {
    std::vector<float> a13, a2, b13, b2;
    dequant_expert(p, l, a13, a2);
    dequant_expert(full, p.local_to_global[static_cast<size_t>(l)], b13, b2);
    EXPECT_TRUE(same_values(a13, b13, "w13"));
    EXPECT_TRUE(same_values(a2, b2, "w2"));
  }
  EXPECT_NE(error_of([&] { partial.load({}); }).find("missing"), std::string::npos);
  for (const std::vector<int>& bad :
       {std::vector<int>{0, 1, 2}, std::vector<int>{0, 0, -1, -1}, std::vector<int>{0, 2, -1, -1},
        std::vector<int>{-1, -1, -1, -1}, std::vector<int>{-2, 0, 1, 2}}) {
    LoadOptions b;
    b.expert_map = bad;
    EXPECT_FALSE(error_of([&] { m.load(b); }).empty()) << "map of size " << bad.size();
  }
}

}  // namespace
}  // namespace qmoe::test
