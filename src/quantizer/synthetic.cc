// Synthetic one-layer BF16 MoE checkpoints (demo and tests): seeded, realistic weight statistics.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/quantizer.h"
#include "qmoe/safetensors.h"
#include "quantizer/names.h"
#include "quantizer/parallel.h"

namespace qmoe {

namespace {

// splitmix64: a small counter-based generator, so every row draws from its own stream.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  // Standard normal (Box-Muller, one value per call).
  float normal() {
    const double u1 = uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r{a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull)};
  return r.next();
}

// BF16 tensor [rows, cols] ~ N(0, std); with `outliers`, rare outliers as trained checkpoints have
// them: each element is, with probability kOutlierRate, replaced by one of magnitude uniform in
// [5σ, 10σ] and random sign (about one per 5 rows of 2048; most 32-element blocks have none, so a
// block scale is set by the Gaussian body as in real weights, not by a planted outlier).
constexpr double kOutlierRate = 1e-4;

Tensor random_bf16(int64_t rows, int64_t cols, float stddev, bool outliers, uint64_t seed) {
  Tensor t = Tensor::zeros(DType::BF16, {rows, cols});
  auto* p = t.mutable_data_as<uint16_t>();
  quantizer_detail::parallel_for(rows, quantizer_detail::resolve_threads(0), [&](int64_t r) {
    Rng rng{mix(seed, static_cast<uint64_t>(r))};
    uint16_t* row = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float v = rng.normal() * stddev;
      if (outliers && rng.uniform() < kOutlierRate) {
        const float mag = static_cast<float>(5.0 + 5.0 * rng.uniform()) * stddev;
        v = rng.uniform() < 0.5 ? -mag : mag;
      }
      row[c] = bf16_encode(v);
    }
  });
  return t;
}

nlohmann::json synthetic_config(const SyntheticShape& s) {
  nlohmann::json j;
  j["model_type"] = s.model_type;
  j["hidden_size"] = s.hidden;
  j["num_hidden_layers"] = 1;
  j["num_experts_per_tok"] = s.top_k;
  j["torch_dtype"] = "bfloat16";
  j["vocab_size"] = 1024;
  j["rms_norm_eps"] = 1e-6;
  if (s.model_type == "qwen3_moe") {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["moe_intermediate_size"] = s.inter;
    j["intermediate_size"] = 3 * s.inter;
    j["num_experts"] = s.experts;
    j["norm_topk_prob"] = true;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["hidden_act"] = "silu";
  } else if (s.model_type == "mixtral") {
    j["architectures"] = {"MixtralForCausalLM"};
    j["intermediate_size"] = s.inter;
    j["num_local_experts"] = s.experts;
    j["hidden_act"] = "silu";
  } else if (s.model_type == "qwen2_moe") {
    j["architectures"] = {"Qwen2MoeForCausalLM"};
    j["moe_intermediate_size"] = s.inter;
    j["shared_expert_intermediate_size"] = 2 * s.inter;
    j["intermediate_size"] = 4 * s.inter;
    j["num_experts"] = s.experts;
    j["norm_topk_prob"] = false;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["hidden_act"] = "silu";
  } else if (s.model_type == "deepseek_v3") {
    // Two layers: layer 0 dense (first_k_dense_replace = 1), layer 1 MoE with a shared expert and
    // grouped sigmoid routing with a correction bias.
    j["architectures"] = {"DeepseekV3ForCausalLM"};
    j["num_hidden_layers"] = 2;
    j["first_k_dense_replace"] = 1;
    j["moe_layer_freq"] = 1;
    j["intermediate_size"] = 2 * s.inter;
    j["moe_intermediate_size"] = s.inter;
    j["n_routed_experts"] = s.experts;
    j["n_shared_experts"] = 1;
    j["n_group"] = 4;
    j["topk_group"] = 2;
    j["topk_method"] = "noaux_tc";
    j["scoring_func"] = "sigmoid";
    j["norm_topk_prob"] = true;
    j["routed_scaling_factor"] = 2.5;
    j["hidden_act"] = "silu";
  } else if (s.model_type == "gpt_oss") {
    j["architectures"] = {"GptOssForCausalLM"};
    j["intermediate_size"] = s.inter;
    j["num_local_experts"] = s.experts;
    j["experts_per_token"] = s.top_k;
    j["swiglu_limit"] = 7.0;
  } else {
    throw Error(fmt::format("synthetic checkpoint: model_type '{}' is not supported (qwen3_moe, qwen2_moe, "
                            "deepseek_v3, mixtral, gpt_oss)",
                            s.model_type));
  }
  return j;
}

}  // namespace

std::vector<SyntheticShape> synthetic_shapes() {
  return {
      {"tiny", "qwen3_moe", 128, 64, 8, 2},
      {"small", "qwen3_moe", 1024, 384, 32, 4},
      {"tiny-mixtral", "mixtral", 128, 64, 8, 2},
      {"tiny-gpt-oss", "gpt_oss", 128, 64, 8, 2},
      {"tiny-qwen2", "qwen2_moe", 128, 64, 8, 2},
      {"tiny-deepseek", "deepseek_v3", 128, 64, 16, 4},
      {"qwen3-30b-a3b", "qwen3_moe", 2048, 768, 128, 8},
      {"qwen3-235b-a22b", "qwen3_moe", 4096, 1536, 128, 8},
      {"mixtral-8x7b", "mixtral", 4096, 14336, 8, 2},
      {"gpt-oss-20b", "gpt_oss", 2880, 2880, 32, 4},
      {"gpt-oss-120b", "gpt_oss", 2880, 2880, 128, 4},
  };
}

const SyntheticShape& synthetic_shape(std::string_view name) {
  static const std::vector<SyntheticShape> shapes = synthetic_shapes();
  for (const auto& s : shapes)
    if (s.name == name) return s;
  std::string known;
  for (const auto& s : shapes)
    known += fmt::format("{}{} ({} H={} I={} E={} K={})", known.empty() ? "" : ", ", s.name, s.model_type, s.hidden,
                         s.inter, s.experts, s.top_k);
  throw Error(fmt::format("unknown demo shape '{}'; known shapes: {}", name, known));
}

void write_synthetic_checkpoint(const std::string& dir, const SyntheticShape& s, uint64_t seed, bool other_modules) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const nlohmann::json cj = synthetic_config(s);
  const ModelConfig cfg = ModelConfig::parse(cj.dump(), "synthetic config.json");
  constexpr float kStd = 0.02f;
  constexpr bool kOutliers = true;
  const int64_t H = s.hidden;
  std::vector<NamedTensor> tensors;
  uint64_t stream = 0;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, float stddev, bool outliers) {
    tensors.push_back({name, random_bf16(rows, cols, stddev, outliers, mix(seed, ++stream))});
  };
  auto add_vec = [&](const std::string& name, int64_t n, float stddev) {
    tensors.push_back({name, random_bf16(1, n, stddev, false, mix(seed, ++stream)).reshape({n})});
  };
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    if (other_modules) {
      for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
        add(fmt::format("model.layers.{}.self_attn.{}.weight", layer, p), H, H, kStd, false);
      add_vec(fmt::format("model.layers.{}.input_layernorm.weight", layer), H, 1.0f);
    }
    const bool moe = std::find(cfg.moe_layers.begin(), cfg.moe_layers.end(), layer) != cfg.moe_layers.end();
    if (!moe) {  // a dense MLP layer (DeepSeek's first layers)
      const int64_t I = cj.value("intermediate_size", 2 * s.inter);
      add(fmt::format("model.layers.{}.mlp.gate_proj.weight", layer), I, H, kStd, kOutliers);
      add(fmt::format("model.layers.{}.mlp.up_proj.weight", layer), I, H, kStd, kOutliers);
      add(fmt::format("model.layers.{}.mlp.down_proj.weight", layer), H, I, kStd, kOutliers);
      continue;
    }
    add(cfg.router_weight_name(layer), s.experts, H, 4.0f * kStd, false);
    if (!cfg.router_bias_name(layer).empty()) add_vec(cfg.router_bias_name(layer), s.experts, 0.1f);
    if (!cfg.correction_bias_name(layer).empty()) {
      Tensor b = Tensor::zeros(DType::F32, {s.experts});
      const Tensor r = random_bf16(1, s.experts, 0.05f, false, mix(seed, ++stream));
      for (int e = 0; e < s.experts; ++e) b.mutable_data_as<float>()[e] = bf16_decode(r.data_as<uint16_t>()[e]);
      tensors.push_back({cfg.correction_bias_name(layer), b});
    }
    for (int e = 0; e < s.experts; ++e)
      for (const auto& l : quantizer_detail::routed_expert_linears(cfg, layer, e)) {
        add(l.prefix + ".weight", l.out, l.in, kStd, kOutliers);
        if (cfg.expert_bias) add_vec(l.prefix + ".bias", l.out, kStd);
      }
    for (const auto& l : quantizer_detail::shared_expert_linears(cfg, layer)) add(l.prefix + ".weight", l.out, l.in, kStd, kOutliers);
    if (!cfg.shared_expert_gate_name(layer).empty()) add(cfg.shared_expert_gate_name(layer), 1, H, kStd, false);
  }
  if (other_modules) {
    add("model.embed_tokens.weight", 256, H, kStd, false);
    add("lm_head.weight", 256, H, kStd, false);
    add_vec("model.norm.weight", H, 1.0f);
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
  std::ofstream out(fs::path(dir) / "config.json", std::ios::binary | std::ios::trunc);
  out << cj.dump(2) << "\n";
  if (!out) throw Error(fmt::format("cannot write {}/config.json", dir));
}

std::vector<float> synthetic_hidden_states(int T, int H, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t) {
    Rng rng{mix(seed ^ 0x5A5A5A5Aull, static_cast<uint64_t>(t))};
    for (int h = 0; h < H; ++h) x[static_cast<size_t>(t) * H + h] = bf16_round(rng.normal());
  }
  return x;
}

}  // namespace qmoe
