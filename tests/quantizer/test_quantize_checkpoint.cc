// quantize_checkpoint end to end: per-scheme round trip through the loader, config round trip,
// calibration, exclusion, sharding, gpt-oss / Mixtral naming, and the conformance source/ cases.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/params.h"
#include "qmoe/quantizer.h"
#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;
const std::string kCases = QMOE_SOURCE_DIR "/../shared/conformance/cases/";

// A fresh temporary directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "qmoe-qz-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Calibration file with hidden_states [T, H] (bf16).
std::string write_calib(const TempDir& d, int T, int H, uint64_t seed) {
  const auto x = synthetic_hidden_states(T, H, seed);
  Tensor hs = Tensor::zeros(DType::BF16, {T, H});
  for (size_t i = 0; i < x.size(); ++i) hs.mutable_data_as<uint16_t>()[i] = bf16_encode(x[i]);
  const std::string p = d / "calib.safetensors";
  write_safetensors(p, {{"hidden_states", hs}});
  return p;
}

QuantizeOptions quiet(const std::string& calib = "") {
  QuantizeOptions o;
  o.progress = false;
  o.threads = 2;
  o.calib_path = calib;
  return o;
}

class CheckpointScheme : public ::testing::TestWithParam<std::string> {};

// Quantize a tiny synthetic model → load through the library → the stored parameters dequantize
// exactly to the formats-library quantization of the source weights, and the config resolves back
// to the same scheme.
TEST_P(CheckpointScheme, RoundTripThroughLoader) {
  const SchemeInfo& s = scheme_by_name(GetParam());
  TempDir d;
  const SyntheticShape& sh = synthetic_shape("tiny");
  write_synthetic_checkpoint(d / "src", sh, 11);
  const std::string calib = write_calib(d, 16, sh.hidden, 3);
  const QuantizeReport rep = quantize_checkpoint(d / "src", d / "dst", s, quiet(act_is_static(s.act) ? calib : ""));
  EXPECT_EQ(rep.quantized_linears, s.method == Method::Unquantized ? 0 : 3 * sh.experts);
  EXPECT_EQ(rep.shards, 1);

  // config.json: the source fields, plus quantization_config that resolves to the same scheme.
  const std::string text = read_text(d / "dst/config.json");
  EXPECT_EQ(text.rfind("{\n  \"", 0), 0u) << "indent 2";
  const auto j = nlohmann::json::parse(text);
  const auto src_j = nlohmann::json::parse(read_text(d / "src/config.json"));
  for (const auto& [k, v] : src_j.items()) EXPECT_EQ(j.at(k), v) << k;
  const ModelConfig cfg = ModelConfig::load(d / "dst");
  const LayerScheme ls = resolve_moe_scheme(cfg, 0);
  EXPECT_EQ(ls.scheme->name, s.name);
  EXPECT_EQ(ls.excluded, s.method == Method::Unquantized && cfg.quant.has_value());
  if (s.method == Method::Unquantized) {
    EXPECT_FALSE(j.contains("quantization_config"));
  } else {
    const auto& ex = j.at("quantization_config").at("exclude");
    for (const char* p : {"lm_head", "re:.*mlp.gate$", "re:.*self_attn.*"})
      EXPECT_NE(std::find(ex.begin(), ex.end(), p), ex.end()) << p;
  }

  // Tensors: every expert linear equals quantize_linear of the source weight (bytes), the router
  // is copied unchanged.
  const Checkpoint src = Checkpoint::open(d / "src");
  const Checkpoint dst = Checkpoint::open(d / "dst");
  EXPECT_TRUE(same_bytes(src.get(cfg.router_weight_name(0)), dst.get(cfg.router_weight_name(0))));
  for (int e = 0; e < sh.experts; ++e)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string prefix = fmt::format("model.layers.0.mlp.experts.{}.{}", e, p);
      const Tensor w = src.get(prefix + ".weight");
      const auto wf = to_f32(w);
      LinearQuantOptions lo;
      lo.input_amax = 1.0f;
      if (s.weight == WeightFormat::Nvfp4 && std::string(p) != "down_proj") {
        float amax = 0;
        for (const char* q : {"gate_proj", "up_proj"})
          for (float v : to_f32(src.get(fmt::format("model.layers.0.mlp.experts.{}.{}.weight", e, q))))
            amax = std::max(amax, std::fabs(v));
        lo.weight_amax = amax;
      }
      const auto q = quantize_linear(prefix, wf.data(), w.dim(0), w.dim(1), s, lo);
      for (const auto& t : q) {
        ASSERT_TRUE(dst.has(t.name)) << t.name;
        if (t.name.find("input_") != std::string::npos) continue;  // calibration-dependent
        EXPECT_TRUE(same_bytes(dst.get(t.name), t.tensor)) << t.name;
      }
    }

  // The loader's exact dequantization (before load-time processing) equals ours.
  const ExpertParams p = load_expert_params(dst, cfg, ls, 0, {});
  for (int e : {0, sh.experts - 1}) {
    std::vector<float> w13, w2;
    dequant_expert(p, e, w13, w2);
    std::vector<NamedTensor> named;
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      for (const auto& n : dst.names())
        if (n.rfind(fmt::format("model.layers.0.mlp.experts.{}.{}.", e, proj), 0) == 0) named.push_back({n, dst.get(n)});
    const auto g = dequantize_linear(fmt::format("model.layers.0.mlp.experts.{}.gate_proj", e), named, s);
    const auto u = dequantize_linear(fmt::format("model.layers.0.mlp.experts.{}.up_proj", e), named, s);
    const auto dn = dequantize_linear(fmt::format("model.layers.0.mlp.experts.{}.down_proj", e), named, s);
    ASSERT_EQ(w13.size(), g.size() + u.size());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(w13[i], g[i]) << "expert " << e << " gate " << i;
    for (size_t i = 0; i < u.size(); ++i) ASSERT_EQ(w13[g.size() + i], u[i]) << "expert " << e << " up " << i;
    ASSERT_EQ(w2, dn) << "expert " << e;
  }

  // And the whole layer loads and runs.
  const MoELayer layer = MoELayer::from_checkpoint(d / "dst", 0);
  EXPECT_EQ(layer.experts().scheme->name, s.name);
  const auto x = synthetic_hidden_states(4, sh.hidden, 5);
  MoEWorkspace ws;
  layer.plan_from_hidden(x.data(), 4, ws);
  std::vector<float> out(x.size());
  layer.run(x.data(), ws, out.data());
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

std::vector<std::string> scheme_names() {
  std::vector<std::string> v;
  for (const auto& s : all_schemes()) v.emplace_back(s.name);
  return v;
}
INSTANTIATE_TEST_SUITE_P(AllSchemes, CheckpointScheme, ::testing::ValuesIn(scheme_names()),
                         [](const auto& info) { return info.param; });

TEST(QuantizeCheckpoint, StaticSchemeWithoutCalibrationFails) {
  TempDir d;
  write_synthetic_checkpoint(d / "src", synthetic_shape("tiny"), 1);
  for (const char* name : {"w_fp8_tensor_a_fp8_static", "nvfp4", "w_int8_tensor_a_int8_static", "w_mxfp4_a_fp8"}) {
    try {
      quantize_checkpoint(d / "src", d / "dst", scheme_by_name(name), quiet());
      ADD_FAILURE() << name << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--calib"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(d / "dst/model.safetensors"));
}

TEST(QuantizeCheckpoint, RejectsQuantizedSourceAndBadCalibration) {
  // A Quark checkpoint is not a valid source.
  TempDir d;
  EXPECT_THROW(quantize_checkpoint(kCases + "qwen3_w_mxfp4", d / "x", scheme_by_name("w_mxfp4"), quiet()), Error);
  // Calibration with the wrong hidden size names the tensor and the expected shape.
  write_synthetic_checkpoint(d / "src", synthetic_shape("tiny"), 1);
  const std::string calib = write_calib(d, 4, 64, 1);
  try {
    quantize_checkpoint(d / "src", d / "dst", scheme_by_name("w_fp8_tensor_a_fp8_static"), quiet(calib));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_states"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[N, 128]"), std::string::npos) << e.what();
  }
}

// Static scales: input_scale of an expert's gate/up = amax of the tokens routed to it / 448;
// down_proj = amax of its activation output / 448. Recomputed here with qmoe routing and fp64 GEMMs.
TEST(QuantizeCheckpoint, CalibrationScalesFollowRouting) {
  TempDir d;
  const SyntheticShape& sh = synthetic_shape("tiny");
  write_synthetic_checkpoint(d / "src", sh, 21);
  const int T = 24, H = sh.hidden, I = sh.inter, E = sh.experts, K = sh.top_k;
  const std::string calib = write_calib(d, T, H, 8);
  quantize_checkpoint(d / "src", d / "fp8", scheme_by_name("w_fp8_tensor_a_fp8_static"), quiet(calib));
  quantize_checkpoint(d / "src", d / "nv", scheme_by_name("nvfp4"), quiet(calib));
  quantize_checkpoint(d / "src", d / "i8", scheme_by_name("w_int8_tensor_a_int8_static"), quiet(calib));

  const Checkpoint src = Checkpoint::open(d / "src");
  const ModelConfig cfg = ModelConfig::load(d / "src");
  const auto x = synthetic_hidden_states(T, H, 8);
  std::vector<float> logits(static_cast<size_t>(T) * E);
  const Tensor rw = src.get(cfg.router_weight_name(0));
  compute_router_logits(x.data(), T, H, rw, nullptr, logits.data());
  std::vector<int32_t> ids(static_cast<size_t>(T) * K);
  std::vector<float> wts(ids.size());
  route(cfg.routing, logits.data(), T, E, K, nullptr, ids.data(), wts.data());

  const Checkpoint fp8 = Checkpoint::open(d / "fp8"), nv = Checkpoint::open(d / "nv"), i8 = Checkpoint::open(d / "i8");
  float max1 = 0, max2 = 0;
  for (int e = 0; e < E; ++e) {
    const std::string p = fmt::format("model.layers.0.mlp.experts.{}.", e);
    const auto g = to_f32(src.get(p + "gate_proj.weight")), u = to_f32(src.get(p + "up_proj.weight"));
    std::vector<int> toks;
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (ids[static_cast<size_t>(t * K + k)] == e) toks.push_back(t);
    if (toks.empty())
      for (int t = 0; t < T; ++t) toks.push_back(t);
    double a1 = 0, a2 = 0;
    for (int t : toks)
      for (int h = 0; h < H; ++h) a1 = std::max(a1, std::fabs(double(x[t * H + h])));
    for (int t : toks)
      for (int i = 0; i < I; ++i) {
        double gg = 0, uu = 0;
        for (int h = 0; h < H; ++h) {
          gg += double(x[t * H + h]) * g[i * H + h];
          uu += double(x[t * H + h]) * u[i * H + h];
        }
        a2 = std::max(a2, std::fabs(gg / (1 + std::exp(-gg)) * uu));
      }
    max1 = std::max<float>(max1, a1);
    max2 = std::max<float>(max2, a2);
    EXPECT_EQ(to_f32(fp8.get(p + "gate_proj.input_scale"))[0], float(a1) / 448.0f) << e;
    EXPECT_EQ(to_f32(fp8.get(p + "up_proj.input_scale"))[0], float(a1) / 448.0f) << e;
    // fp32 GEMM in the quantizer vs fp64 here: a few ulps.
    EXPECT_NEAR(to_f32(fp8.get(p + "down_proj.input_scale"))[0], a2 / 448.0, a2 / 448.0 * 1e-5) << e;
    EXPECT_NEAR(to_f32(i8.get(p + "down_proj.input_scale"))[0], a2 / 127.0, a2 / 127.0 * 1e-5) << e;
    EXPECT_EQ(to_f32(i8.get(p + "gate_proj.input_scale"))[0], float(a1) / 127.0f) << e;
    EXPECT_EQ(i8.get(p + "gate_proj.input_zero_point").data_as<int8_t>()[0], 0);
  }
  // NVFP4: input_scale_2 synced across experts (max over experts).
  for (int e = 0; e < E; ++e) {
    const std::string p = fmt::format("model.layers.0.mlp.experts.{}.", e);
    EXPECT_EQ(to_f32(nv.get(p + "gate_proj.input_scale_2"))[0], max1 / (6.0f * 448.0f)) << e;
    EXPECT_NEAR(to_f32(nv.get(p + "down_proj.input_scale_2"))[0], max2 / (6.0 * 448.0), max2 / 2688.0 * 1e-5) << e;
  }
}

TEST(QuantizeCheckpoint, PerLayerCalibrationTensorWins) {
  TempDir d;
  const SyntheticShape& sh = synthetic_shape("tiny");
  write_synthetic_checkpoint(d / "src", sh, 6);
  const auto x = synthetic_hidden_states(10, sh.hidden, 1);
  const auto y = synthetic_hidden_states(10, sh.hidden, 2);
  Tensor tx = Tensor::zeros(DType::F32, {10, sh.hidden}), ty = Tensor::zeros(DType::F32, {10, sh.hidden});
  float amax_y = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    tx.mutable_data_as<float>()[i] = 4.0f * x[i];  // the generic tensor: much larger
    ty.mutable_data_as<float>()[i] = y[i];
    amax_y = std::max(amax_y, std::fabs(y[i]));
  }
  write_safetensors(d / "calib.safetensors", {{"hidden_states", tx}, {"model.layers.0.hidden_states", ty}});
  quantize_checkpoint(d / "src", d / "dst", scheme_by_name("w_fp8_tensor_a_fp8_static"), quiet(d / "calib.safetensors"));
  const Checkpoint q = Checkpoint::open(d / "dst");
  // Every token is routed to some expert, so the max over experts is the amax of all tokens.
  float mx = 0;
  for (int e = 0; e < sh.experts; ++e)
    mx = std::max(mx, to_f32(q.get(fmt::format("model.layers.0.mlp.experts.{}.gate_proj.input_scale", e)))[0]);
  EXPECT_EQ(mx, amax_y / 448.0f);
}

TEST(QuantizeCheckpoint, ExcludedLayerIsCopiedAndLoadsUnquantized) {
  TempDir d;
  write_synthetic_checkpoint(d / "src", synthetic_shape("tiny"), 2);
  QuantizeOptions o = quiet();
  o.exclude = {"re:.*experts\\.3\\.up_proj"};
  const QuantizeReport r = quantize_checkpoint(d / "src", d / "dst", scheme_by_name("w_mxfp4"), o);
  EXPECT_EQ(r.quantized_linears, 0);  // exclusion is all-or-nothing per layer
  EXPECT_EQ(r.excluded_layers.size(), 1u);
  const auto j = nlohmann::json::parse(read_text(d / "dst/config.json"));
  const auto& ex = j["quantization_config"]["exclude"];
  EXPECT_EQ(ex.back(), "re:.*experts\\.3\\.up_proj");
  const Checkpoint src = Checkpoint::open(d / "src"), dst = Checkpoint::open(d / "dst");
  EXPECT_EQ(src.names(), dst.names());
  for (const auto& n : src.names()) EXPECT_TRUE(same_bytes(src.get(n), dst.get(n))) << n;
  const MoELayer layer = MoELayer::from_checkpoint(d / "dst", 0);
  EXPECT_EQ(layer.experts().scheme->method, Method::Unquantized);
}

TEST(QuantizeCheckpoint, ShardsWithIndexAndCopiesOtherFiles) {
  TempDir d;
  write_synthetic_checkpoint(d / "src", synthetic_shape("tiny"), 4);
  std::ofstream(d / "src/generation_config.json") << "{\"do_sample\": true}\n";
  std::ofstream(d / "src/tokenizer.json") << "{}\n";
  QuantizeOptions o = quiet();
  const QuantizeReport one = quantize_checkpoint(d / "src", d / "one", scheme_by_name("w_mxfp6_e2m3"), o);
  o.shard_size = 40000;  // a few linears per shard
  const QuantizeReport many = quantize_checkpoint(d / "src", d / "many", scheme_by_name("w_mxfp6_e2m3"), o);
  EXPECT_EQ(one.shards, 1);
  EXPECT_GT(many.shards, 3);
  EXPECT_TRUE(fs::exists(d / "many/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(d / "many/model.safetensors"));
  EXPECT_TRUE(fs::exists(fmt::format("{}/model-00001-of-{:05d}.safetensors", d / "many", many.shards)));
  const auto idx = nlohmann::json::parse(read_text(d / "many/model.safetensors.index.json"));
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), many.total_bytes);
  const Checkpoint a = Checkpoint::open(d / "one"), b = Checkpoint::open(d / "many");
  ASSERT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) EXPECT_TRUE(same_bytes(a.get(n), b.get(n))) << n;
  EXPECT_EQ(read_text(d / "many/generation_config.json"), "{\"do_sample\": true}\n");
  EXPECT_TRUE(fs::exists(d / "many/tokenizer.json"));
  // Re-quantizing into the sharded directory as one file removes the stale shards and index.
  o.shard_size = 5000000000ull;
  quantize_checkpoint(d / "src", d / "many", scheme_by_name("w_mxfp6_e2m3"), o);
  EXPECT_FALSE(fs::exists(d / "many/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(d / "many/model.safetensors"));
  EXPECT_EQ(Checkpoint::open(d / "many").names(), a.names());
}

TEST(QuantizeCheckpoint, GptOssAndMixtralNaming) {
  TempDir d;
  for (const char* shape : {"tiny-gpt-oss", "tiny-mixtral"}) {
    const SyntheticShape& sh = synthetic_shape(shape);
    const std::string src = d / (std::string(shape) + "-src"), dst = d / (std::string(shape) + "-dst");
    write_synthetic_checkpoint(src, sh, 9);
    for (const char* scheme : {"w_mxfp4", "w_fp8_channel_a_fp8_dyn_token"}) {
      quantize_checkpoint(src, dst, scheme_by_name(scheme), quiet());
      const ModelConfig cfg = ModelConfig::load(dst);
      const Checkpoint s = Checkpoint::open(src), q = Checkpoint::open(dst);
      if (sh.model_type == "gpt_oss") {
        // Biases copied as-is, gate_up_proj quantized as one Linear [2I, H].
        EXPECT_TRUE(same_bytes(s.get("model.layers.0.mlp.experts.2.gate_up_proj.bias"),
                               q.get("model.layers.0.mlp.experts.2.gate_up_proj.bias")));
        EXPECT_TRUE(same_bytes(s.get("model.layers.0.mlp.router.bias"), q.get("model.layers.0.mlp.router.bias")));
        EXPECT_EQ(q.info("model.layers.0.mlp.experts.2.gate_up_proj.weight_scale")->shape[0], 2 * sh.inter);
      } else {
        EXPECT_TRUE(q.has("model.layers.0.block_sparse_moe.experts.7.w3.weight_scale"));
        EXPECT_TRUE(same_bytes(s.get("model.layers.0.block_sparse_moe.gate.weight"),
                               q.get("model.layers.0.block_sparse_moe.gate.weight")));
      }
      const MoELayer layer = MoELayer::from_checkpoint(dst, 0);
      EXPECT_EQ(layer.experts().scheme->name, std::string(scheme)) << shape;
      EXPECT_FALSE(resolve_moe_scheme(cfg, 0).excluded);
    }
  }
}

TEST(QuantizeCheckpoint, SharedExpertsDenseLayersAndOtherModules) {
  TempDir d;
  const SyntheticShape& sh = synthetic_shape("tiny-deepseek");
  write_synthetic_checkpoint(d / "src", sh, 31, /*other_modules=*/true);
  const std::string calib = write_calib(d, 12, sh.hidden, 2);
  quantize_checkpoint(d / "src", d / "mx", scheme_by_name("w_mxfp4"), quiet());
  quantize_checkpoint(d / "src", d / "fp8", scheme_by_name("w_fp8_tensor_a_fp8_static"), quiet(calib));
  const Checkpoint src = Checkpoint::open(d / "src"), mx = Checkpoint::open(d / "mx");
  // Everything but the expert linears is copied unchanged (dense layer 0, attention, norms, ...).
  for (const auto& n : src.names()) {
    if (n.find(".experts.") != std::string::npos || n.find(".shared_experts.") != std::string::npos) continue;
    ASSERT_TRUE(mx.has(n)) << n;
    EXPECT_TRUE(same_bytes(src.get(n), mx.get(n))) << n;
  }
  EXPECT_FALSE(mx.has("model.layers.0.mlp.gate_proj.weight_scale"));
  EXPECT_EQ(mx.info("model.layers.1.mlp.shared_experts.down_proj.weight_scale")->dtype, DType::U8);
  EXPECT_EQ(mx.info("model.layers.1.mlp.gate.e_score_correction_bias")->dtype, DType::F32);
  const ModelConfig cfg = ModelConfig::load(d / "mx");
  const auto j = nlohmann::json::parse(read_text(d / "mx/config.json"));
  const auto& ex = j["quantization_config"]["exclude"];
  EXPECT_NE(std::find(ex.begin(), ex.end(), "re:model\\.layers\\.0\\.mlp\\..*"), ex.end()) << ex.dump();
  EXPECT_EQ(resolve_shared_expert_scheme(cfg, 1).scheme->name, "w_mxfp4");
  const MoELayer layer = MoELayer::from_checkpoint(d / "mx", 1);
  ASSERT_TRUE(layer.shared_expert().has_value());
  EXPECT_EQ(layer.shared_expert()->scheme->name, "w_mxfp4");
  // Static scales of the shared expert: every calibration token goes through it.
  const auto x = synthetic_hidden_states(12, sh.hidden, 2);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const Checkpoint fp8 = Checkpoint::open(d / "fp8");
  EXPECT_EQ(to_f32(fp8.get("model.layers.1.mlp.shared_experts.gate_proj.input_scale"))[0], amax / 448.0f);
  EXPECT_GT(to_f32(fp8.get("model.layers.1.mlp.shared_experts.down_proj.input_scale"))[0], 0.0f);
  EXPECT_EQ(MoELayer::from_checkpoint(d / "fp8", 1).shared_expert()->scheme->name, "w_fp8_tensor_a_fp8_static");
}

TEST(QuantizeCheckpoint, Qwen2SharedExpertCanBeExcluded) {
  TempDir d;
  write_synthetic_checkpoint(d / "src", synthetic_shape("tiny-qwen2"), 5);
  QuantizeOptions o = quiet();
  o.exclude = {"re:.*shared_expert\\..*"};
  const QuantizeReport r = quantize_checkpoint(d / "src", d / "dst", scheme_by_name("w_int8_channel_a_int8_dyn_token"), o);
  EXPECT_EQ(r.quantized_linears, 3 * 8);
  EXPECT_EQ(r.excluded_linears, 3);
  const Checkpoint src = Checkpoint::open(d / "src"), dst = Checkpoint::open(d / "dst");
  for (const char* n : {"model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight"})
    EXPECT_TRUE(same_bytes(src.get(n), dst.get(n))) << n;
  EXPECT_EQ(dst.info("model.layers.0.mlp.experts.0.up_proj.weight")->dtype, DType::I8);
  const MoELayer layer = MoELayer::from_checkpoint(d / "dst", 0);
  EXPECT_EQ(layer.experts().scheme->name, "w_int8_channel_a_int8_dyn_token");
  EXPECT_EQ(layer.shared_expert()->scheme->method, Method::Unquantized);
  // Without the exclusion the shared expert is quantized too.
  quantize_checkpoint(d / "src", d / "all", scheme_by_name("w_int8_channel_a_int8_dyn_token"), quiet());
  EXPECT_EQ(Checkpoint::open(d / "all").info("model.layers.0.mlp.shared_expert.up_proj.weight")->dtype, DType::I8);
}

// `qmoe quantize source --scheme <case scheme>` reproduces the case's weight tensors byte for byte
// (NVFP4: gate/up share weight_scale_2; static NVFP4 needs calibration: the case's io hidden states).
class ConformanceSource : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceSource, ReproducesWeightTensors) {
  const std::string c = kCases + GetParam();
  const auto cj = nlohmann::json::parse(read_text(c + "/case.json"));
  const SchemeInfo& s = scheme_by_name(cj.at("scheme").get<std::string>());
  TempDir d;
  const QuantizeReport r =
      quantize_checkpoint(c + "/source", d / "q", s, quiet(act_is_static(s.act) ? c + "/io.safetensors" : ""));
  EXPECT_GT(r.quantized_linears, 0);
  const Checkpoint ours = Checkpoint::open(d / "q");
  const auto ref = SafetensorsFile::open(c + "/model.safetensors");
  int compared = 0;
  for (const auto& t : ref->tensors()) {
    const std::string& n = t.name;
    const bool weight = n.ends_with(".weight") || n.ends_with(".weight_scale") || n.ends_with(".weight_scale_2") ||
                        n.ends_with(".bias");
    if (!weight) continue;
    ASSERT_TRUE(ours.has(n)) << n;
    EXPECT_TRUE(same_bytes(ours.get(n), ref->get(n))) << n;
    ++compared;
  }
  EXPECT_GT(compared, 0);
  // Same tensor set as the case (input scales included).
  for (const auto& t : ref->tensors()) EXPECT_TRUE(ours.has(t.name)) << t.name;
  EXPECT_EQ(ours.names().size(), ref->tensors().size());
  // Without calibration-dependent tensors the whole file is byte-identical (safetensors writer
  // order and header padding included).
  if (!act_is_static(s.act)) {
    EXPECT_EQ(read_text(d / "q/model.safetensors"), read_text(c + "/model.safetensors"));
  }
  // And the quantized layer reproduces the case's expected output.
  const auto io = SafetensorsFile::open(c + "/io.safetensors");
  VerifyOptions vo;
  vo.kernels = {Kernel::Reference};
  if (!act_is_static(s.act)) {
    // Identical weights + dynamic activations: the case's expected output exactly applies.
    fs::copy_file(c + "/io.safetensors", d / "q/io.safetensors");
    fs::copy_file(c + "/case.json", d / "q/case.json");
    for (const auto& row : verify_case(d / "q", vo)) EXPECT_TRUE(row.pass) << row.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ConformanceSource,
                         ::testing::Values("edge_topk_all_qwen3_nvfp4", "gpt_oss_w_mxfp4_bias", "qwen3_w_mxfp4_a_mxfp4",
                                           "qwen3_w_mxfp6_e3m2_a_mxfp6_e3m2"));

}  // namespace
}  // namespace qmoe
