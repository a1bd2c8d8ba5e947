// The benchmark face (src/bench/bench.h), CPU side: floors arithmetic against performance.md §4,
// option checks, routing, and the JSON / CSV / table / SVG fields that outside tools read.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "bench/bench.h"
#include "qmoe/error.h"
#include "qmoe/schemes.h"

namespace qmoe::bench {
namespace {

double floor_us_of(const char* shape, const char* scheme, int T, bool expected_u = true) {
  const Shape& s = shape_by_name(shape);
  const SchemeInfo& sc = scheme_by_name(scheme);
  const double U = expected_u ? expected_unique_experts(s.E, s.K, T) : 0.0;
  const double bytes = U * estimated_expert_bytes(sc, s.H, s.I) + 2.0 * T * s.H * 2;
  return floors(bytes, layer_flops(T, s.K, s.H, s.I), Limits{kH200BytesPerS, h200_peak_flops(sc)}).floor_us;
}

TEST(BenchFloors, MemoryAndComputeFloor) {
  const Floors m = floors(4.3e9, 1e11, Limits{4.3e12, 790e12});
  EXPECT_DOUBLE_EQ(m.mem_us, 1000.0);
  EXPECT_NEAR(m.compute_us, 1e11 / 790e12 * 1e6, 1e-9);
  EXPECT_DOUBLE_EQ(m.floor_us, 1000.0);
  EXPECT_EQ(m.bound, 'M');
  const Floors c = floors(4.3e6, 790e12, Limits{4.3e12, 790e12});
  EXPECT_DOUBLE_EQ(c.compute_us, 1e6);
  EXPECT_DOUBLE_EQ(c.floor_us, 1e6);
  EXPECT_EQ(c.bound, 'C');
  // No known peak (the CPU without --peak-tflops): only the memory floor.
  const Floors n = floors(1e9, 1e15, Limits{1e10, 0.0});
  EXPECT_DOUBLE_EQ(n.compute_us, 0.0);
  EXPECT_DOUBLE_EQ(n.floor_us, 1e5);
  EXPECT_EQ(n.bound, 'M');
}

TEST(BenchFloors, MatchPerformanceSection4Tables) {
  // Mixtral-8x7B, H200 @ 4.3 TB/s (performance.md §4): MXFP4 W4A16 T=1 43.5 µs, T=16 172.4 µs;
  // int8 W8A8 T=1 82.0 µs; bf16 T=16 649.0 µs; MXFP4 W4A16 T=1024 913.4 µs compute-bound.
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "w_mxfp4", 1), 43.5, 0.06);
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "w_mxfp4", 16), 172.4, 0.06);
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "w_int8_channel_a_int8_dyn_token", 1), 82.0, 0.06);
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "unquantized", 16), 649.0, 0.06);
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "w_mxfp4", 1024), 913.4, 0.06);
  // MXFP4 W4A8 (8-bit MMA): 456.7 µs at T=1024 (compute-bound at 1580 TFLOP/s).
  EXPECT_NEAR(floor_us_of("mixtral-8x7b", "w_mxfp4_a_fp8", 1024), 456.7, 0.06);
  // DeepSeek-V3 T=16: U = 102.0, MXFP4 554.9 µs.
  EXPECT_NEAR(expected_unique_experts(256, 8, 16), 102.0, 0.05);
  EXPECT_NEAR(floor_us_of("deepseek-v3", "w_mxfp4", 16), 554.9, 0.06);
}

TEST(BenchFloors, PeaksAndFlops) {
  EXPECT_EQ(h200_peak_flops(scheme_by_name("w_mxfp4")), 790e12);
  EXPECT_EQ(h200_peak_flops(scheme_by_name("unquantized")), 790e12);
  EXPECT_EQ(h200_peak_flops(scheme_by_name("w_mxfp4_a_mxfp6_e2m3")), 790e12);
  EXPECT_EQ(h200_peak_flops(scheme_by_name("w_mxfp4_a_mxfp4")), 1580e12);
  EXPECT_EQ(h200_peak_flops(scheme_by_name("w_int8_channel_a_int8_dyn_token")), 1580e12);
  EXPECT_EQ(h200_peak_flops(scheme_by_name("w_fp8_channel_a_fp8_dyn_token")), 1580e12);
  EXPECT_DOUBLE_EQ(layer_flops(1, 2, 4096, 14336), 6.0 * 2 * 4096 * 14336);
  EXPECT_DOUBLE_EQ(expected_unique_experts(8, 2, 1), 2.0);
  EXPECT_DOUBLE_EQ(estimated_expert_bytes(scheme_by_name("unquantized"), 4, 8), 3.0 * 4 * 8 * 2);
}

TEST(BenchOptions, Tokens) {
  EXPECT_EQ(parse_tokens("1,16,,128"), (std::vector<int>{1, 16, 128}));
  EXPECT_EQ(parse_tokens("16,1,16"), (std::vector<int>{1, 16}));
  EXPECT_THROW(parse_tokens("1,x"), Error);
  EXPECT_THROW(parse_tokens("0"), Error);
  EXPECT_THROW(parse_tokens("-3"), Error);
  EXPECT_THROW(parse_tokens("12abc"), Error);
  EXPECT_EQ(split_list(",a,,b,"), (std::vector<std::string>{"a", "b"}));
}

TEST(BenchOptions, SchemeEntriesWithSuffixes) {
  const SchemeEntry e = parse_scheme_entry("w_mxfp4+bf16act+tile16+route");
  EXPECT_EQ(e.label, "w_mxfp4+bf16act+tile16+route");
  EXPECT_EQ(e.scheme->name, "w_mxfp4");
  EXPECT_TRUE(e.bf16_act);
  EXPECT_TRUE(e.route);
  EXPECT_FALSE(e.x_bf16);
  EXPECT_FALSE(e.no_wgmma);
  EXPECT_EQ(e.token_tile, 16);
  EXPECT_TRUE(e.has_suffix());
  const SchemeEntry n = parse_scheme_entry("unquantized+xbf16+nowg");
  EXPECT_TRUE(n.x_bf16);
  EXPECT_TRUE(n.no_wgmma);
  EXPECT_EQ(n.ksplit, 0);
  EXPECT_FALSE(n.fp8_mma);
  const SchemeEntry f = parse_scheme_entry("w_fp8_channel_a_fp8_dyn_token+f8mma");
  EXPECT_TRUE(f.fp8_mma);
  EXPECT_EQ(f.label, "w_fp8_channel_a_fp8_dyn_token+f8mma");
  EXPECT_EQ(parse_scheme_entry("nvfp4+ks3").ksplit, 3);
  EXPECT_EQ(parse_scheme_entry("nvfp4+ks16+tile8").ksplit, 16);
  EXPECT_THROW(parse_scheme_entry("nvfp4+ks0"), Error);
  EXPECT_THROW(parse_scheme_entry("nvfp4+ks17"), Error);
  // Aliases resolve to the canonical label.
  const SchemeEntry a = parse_scheme_entry("mxfp4");
  EXPECT_EQ(a.label, "w_mxfp4_a_mxfp4");
  EXPECT_FALSE(a.has_suffix());
  EXPECT_THROW(parse_scheme_entry("w_mxfp4+bogus"), Error);
  EXPECT_THROW(parse_scheme_entry("w_mxfp4+tile7"), Error);
  EXPECT_THROW(parse_scheme_entry("no_such_scheme"), Error);
}

TEST(BenchOptions, Resolve) {
  Options o;
  o.shapes = "tiny,small";
  o.schemes = "w_mxfp4,nvfp4";
  o.tokens = "16,1";
  Plan p = resolve(o);
  ASSERT_EQ(p.shapes.size(), 2u);
  EXPECT_STREQ(p.shapes[1]->name, "small");
  ASSERT_EQ(p.schemes.size(), 2u);
  EXPECT_EQ(p.tokens, (std::vector<int>{1, 16}));
  EXPECT_DOUBLE_EQ(p.max_weight_gb, 8.0);

  o.schemes = "all";
  EXPECT_EQ(resolve(o).schemes.size(), all_schemes().size());

  o.schemes = "w_mxfp4+bf16act";  // the one suffix the CPU takes
  EXPECT_TRUE(resolve(o).schemes[0].bf16_act);
  for (const char* s : {"w_mxfp4+xbf16", "w_mxfp4+route", "w_mxfp4+nowg", "w_fp8_tensor_a_fp8_static+f8mma", "w_mxfp4+tile16", "w_mxfp4+ks2"}) {
    o.schemes = s;
    EXPECT_THROW(resolve(o), Error) << s;  // CUDA variants
  }
  o.schemes = "w_mxfp4+bf16act";
  o.device = "cuda";
  p = resolve(o);
  EXPECT_TRUE(p.schemes[0].bf16_act);
  EXPECT_DOUBLE_EQ(p.max_weight_gb, 40.0);
  o.kernel = "reference";
  EXPECT_THROW(resolve(o), Error);  // the reference is a CPU kernel
  o.kernel = "optimized";
  o.probe_gib = 1.0;
  EXPECT_THROW(resolve(o), Error);  // the CUDA probe streams >= 4 GiB
  o.probe_gib = 4.0;
  o.token_tile = 12;
  EXPECT_THROW(resolve(o), Error);
  o.token_tile = 0;

  Options c;
  c.device = "tpu";
  EXPECT_THROW(resolve(c), Error);
  c.device = "cpu";
  c.copies = 3;
  EXPECT_THROW(resolve(c), Error);  // CUDA option on the CPU
  c.copies = 0;
  c.reps = 0;
  EXPECT_THROW(resolve(c), Error);
  c.reps = 1;
  c.shapes = "mixtral-8x7b";
  c.experts = 1;  // below top-k 2
  EXPECT_THROW(resolve(c), Error);
  c.experts = 0;
  c.shapes = "nope";
  EXPECT_THROW(resolve(c), Error);
}

TEST(BenchRouting, DistinctExpertsNormalisedWeights) {
  std::vector<int32_t> ids, ids2;
  std::vector<float> w, w2;
  random_routing(7, 64, 16, 4, ids, w);
  random_routing(7, 64, 16, 4, ids2, w2);
  EXPECT_EQ(ids, ids2);
  EXPECT_EQ(w, w2);
  ASSERT_EQ(ids.size(), 64u * 4);
  for (int t = 0; t < 64; ++t) {
    std::set<int32_t> s;
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      const int32_t e = ids[static_cast<size_t>(t) * 4 + k];
      EXPECT_GE(e, 0);
      EXPECT_LT(e, 16);
      s.insert(e);
      EXPECT_GT(w[static_cast<size_t>(t) * 4 + k], 0.0f);
      sum += w[static_cast<size_t>(t) * 4 + k];
    }
    EXPECT_EQ(s.size(), 4u);
    EXPECT_NEAR(sum, 1.0f, 1e-5f);
  }
  random_routing(1, 3, 8, 8, ids, w);  // top_k = E: every expert once per token
  for (int t = 0; t < 3; ++t) EXPECT_EQ(std::set<int32_t>(ids.begin() + t * 8, ids.begin() + t * 8 + 8).size(), 8u);
}

Report sample_report(const std::string& device) {
  Report r;
  r.device = device;
  r.kernel = "optimized";
  r.title = "t <&>";
  r.header = "device " + device;
  r.device_fields = {{"threads", 2}, {"isa", "avx2"}};
  for (int T : {1, 16}) {
    Point p;
    p.shape = "qwen3-30b-a3b";
    p.scheme = "w_mxfp4+bf16act";
    p.tokens = T;
    p.E = 128;
    p.K = 8;
    p.H = 2048;
    p.I = 768;
    p.reps = 5;
    p.median_us = 100.0 * T;
    p.min_us = 90.0 * T;
    p.unique_experts = 8.0 * T;
    p.touched_bytes = 1e6 * T;
    p.flops = layer_flops(T, 8, 2048, 768);
    p.gbps = p.touched_bytes / (p.median_us * 1e-6) / 1e9;
    p.tflops = p.flops / (p.median_us * 1e-6) / 1e12;
    p.bandwidth_gbps = 20.0;
    p.pct_of_bandwidth = 100.0 * p.gbps / 20.0;
    p.working_set_bytes = 5e8;
    p.weight_copies = 3;
    p.floor = floors(p.touched_bytes, p.flops, Limits{4.3e12, 790e12});
    p.measured_mem_floor_us = p.touched_bytes / 20e9 * 1e6;
    if (device == "cuda") {
      p.cublas_bf16_us = 50.0 * T;
      if (T == 1) p.vllm_bf16_us = 31.1;
    }
    r.points.push_back(p);
  }
  if (device == "cuda") r.anchor_method = "cublasGemmGroupedBatchedEx";
  return r;
}

TEST(BenchOutputs, JsonFields) {
  const nlohmann::json j = to_json(sample_report("cpu"));
  ASSERT_EQ(j.size(), 2u);
  const auto& p = j[1];
  for (const char* k :
       {"shape", "scheme", "tokens", "device", "kernel", "E", "K", "H", "I", "reps", "median_us", "min_us", "tokens_per_s",
        "unique_experts", "touched_bytes", "gbps", "bandwidth_gbps", "pct_of_bandwidth", "above_bandwidth",
        "working_set_bytes", "weight_copies", "tflops", "flops", "mem_floor_us", "compute_floor_us", "floor_us", "bound",
        "pct_floor", "pct_mem_floor", "measured_mem_floor_us", "pct_measured_mem_floor", "threads", "isa"})
    EXPECT_TRUE(p.contains(k)) << k;
  EXPECT_EQ(p.at("device"), "cpu");
  EXPECT_EQ(p.at("tokens"), 16);
  EXPECT_EQ(p.at("threads"), 2);
  EXPECT_DOUBLE_EQ(p.at("median_us").get<double>(), 1600.0);
  EXPECT_DOUBLE_EQ(p.at("tokens_per_s").get<double>(), 16 / 1600e-6);
  EXPECT_EQ(p.at("above_bandwidth").get<bool>(), p.at("pct_of_bandwidth").get<double>() > 100.0);
  EXPECT_EQ(p.at("bound"), "M");
  EXPECT_NEAR(p.at("pct_mem_floor").get<double>(), 100.0 * (16e6 / 4.3e12 * 1e6) / 1600.0, 1e-9);
  EXPECT_FALSE(p.contains("cublas_bf16_us"));

  const nlohmann::json g = to_json(sample_report("cuda"));
  EXPECT_DOUBLE_EQ(g[0].at("cublas_bf16_us").get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(g[0].at("speedup_vs_cublas_bf16").get<double>(), 0.5);
  EXPECT_EQ(g[0].at("cublas_anchor"), "cublasGemmGroupedBatchedEx");
  EXPECT_DOUBLE_EQ(g[0].at("vllm_bf16_us").get<double>(), 31.1);
  EXPECT_TRUE(g[1].at("vllm_bf16_us").is_null());  // NaN → null, valid JSON
}

TEST(BenchOutputs, CsvKeepsBenchCudaColumns) {
  const std::string s = csv(sample_report("cuda"));
  EXPECT_EQ(s.rfind("shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,pct_floor,vllm_bf16_us,vllm_int8_us,vllm_fp8_us,", 0),
            0u);
  EXPECT_NE(s.find("\nqwen3-30b-a3b,w_mxfp4+bf16act,1,8,100.00,"), std::string::npos) << s;
  EXPECT_NE(s.find(",31.1,nan,nan,"), std::string::npos) << s;
}

TEST(BenchOutputs, SummaryTableAndSvg) {
  const Report r = sample_report("cuda");
  const std::string t = summary_table(r);
  EXPECT_NE(t.find("| shape | scheme | T=1 | T=16 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| qwen3-30b-a3b | w_mxfp4+bf16act | 100 ("), std::string::npos) << t;
  EXPECT_NE(t.find("cuBLAS bf16"), std::string::npos) << t;
  EXPECT_NE(t.find("*50* | *800* |"), std::string::npos) << t;
  const std::string s = svg(r);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("qwen3-30b-a3b / w_mxfp4+bf16act"), std::string::npos);
  EXPECT_NE(s.find("t &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(s.find("% of measured read bandwidth (20.0 GB/s)"), std::string::npos);
  Report empty;
  EXPECT_THROW(svg(empty), Error);
}

TEST(BenchCuda, AbsentBackendSaysSo) {
  if (cuda_built_in()) GTEST_SKIP() << "built with CUDA";
  Options o;
  o.device = "cuda";
  try {
    run(resolve(o));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA is not built in"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qmoe::bench
