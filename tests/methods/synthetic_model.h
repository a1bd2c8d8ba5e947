// Small synthetic Quark checkpoints for the parameter-rule tests: random but valid tensors of any
// registry scheme, written with qmoe::write_safetensors into a temporary directory.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "methods_test_util.h"
#include "qmoe/config.h"
#include "qmoe/formats.h"
#include "qmoe/params.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace qmoe::test {

inline Tensor scalar_f32(float v, Shape shape = {}) { return Tensor::from_f32({v}, std::move(shape)); }

inline Tensor scalar_i8(int8_t v) {
  Tensor t = Tensor::zeros(DType::I8, {});
  t.mutable_data_as<int8_t>()[0] = v;
  return t;
}

inline Tensor bf16_tensor(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::BF16, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.mutable_data_as<uint16_t>()[i] = bf16_encode(v[i]);
  return t;
}

inline Tensor random_bytes(DType d, Shape shape, std::mt19937& rng, int lo = 0, int hi = 255) {
  Tensor t = Tensor::zeros(d, std::move(shape));
  std::uniform_int_distribution<int> dist(lo, hi);
  uint8_t* b = t.mutable_data_as<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) {
    int v = dist(rng);
    if (d == DType::F8_E4M3 && (v & 0x7F) == 0x7F) v = 0x38;  // no NaN codes
    b[i] = static_cast<uint8_t>(v);
  }
  return t;
}

// A one-layer MoE checkpoint for `scheme_name` with E experts, hidden H, intermediate I.
class SyntheticModel {
 public:
  SyntheticModel(const std::string& scheme_name, ExpertNaming naming, int E, int H, int I, bool bias = false,
                 unsigned seed = 1)
      : rng_(seed) {
    cfg.model_type = naming == ExpertNaming::Mixtral ? "mixtral" : naming == ExpertNaming::GptOss ? "gpt_oss" : "qwen3_moe";
    cfg.hidden_size = H;
    cfg.moe_intermediate_size = I;
    cfg.num_experts = E;
    cfg.top_k = std::min(2, E);
    cfg.num_layers = 1;
    cfg.naming = naming;
    cfg.moe_layers = {0};
    cfg.expert_bias = bias;
    if (naming == ExpertNaming::GptOss) {
      cfg.activation = Activation::SwigluOai;
      cfg.swiglu_limit = 7.0f;
    }
    scheme.scheme = &scheme_by_name(scheme_name);
    scheme.prefix = cfg.experts_prefix(0);
    scheme.reason = "synthetic test";
    const auto names = cfg.projection_names();
    for (int e = 0; e < E; ++e) {
      if (naming == ExpertNaming::GptOss) {
        add_linear(base(e, names[0]), 2 * I, H);
        add_linear(base(e, names[2]), H, I);
      } else {
        add_linear(base(e, names[0]), I, H);
        add_linear(base(e, names[1]), I, H);
        add_linear(base(e, names[2]), H, I);
        // NVFP4: w1 and w3 share their global scale (Quark syncs them; unequal ones are an error).
        if (scheme.scheme->weight == WeightFormat::Nvfp4)
          set(base(e, names[1]) + ".weight_scale_2", get(base(e, names[0]) + ".weight_scale_2").clone());
      }
    }
  }

  std::string base(int e, const std::string& proj) const {
    return cfg.experts_prefix(0) + "." + std::to_string(e) + "." + proj;
  }

  // Weight, scales, static input scales (+ bias when the model has biases) of one Linear [out, in].
  void add_linear(const std::string& b, int64_t out, int64_t in) {
    const SchemeInfo& s = *scheme.scheme;
    const bool stat = act_is_static(s.act);
    switch (s.weight) {
      case WeightFormat::Mxfp4:
      case WeightFormat::Nvfp4: set(b + ".weight", random_bytes(DType::U8, {out, in / 2}, rng_)); break;
      case WeightFormat::Mxfp6E2M3:
      case WeightFormat::Mxfp6E3M2: set(b + ".weight", random_bytes(DType::U8, {out, in * 3 / 4}, rng_)); break;
      case WeightFormat::Int8: set(b + ".weight", random_bytes(DType::I8, {out, in}, rng_)); break;
      case WeightFormat::Fp8E4M3: set(b + ".weight", random_bytes(DType::F8_E4M3, {out, in}, rng_)); break;
      case WeightFormat::BF16: {
        std::vector<float> v(static_cast<size_t>(out * in));
        std::normal_distribution<float> nd(0.0f, 0.1f);
        for (float& x : v) x = nd(rng_);
        set(b + ".weight", bf16_tensor(v, {out, in}));
        break;
      }
    }
    if (is_mx_weight(s.weight)) {
      set(b + ".weight_scale", random_bytes(DType::U8, {out, in / 32}, rng_, 118, 130));
      if (stat) set(b + ".input_scale", scalar_f32(next_scale(0.05f)));
    } else if (s.weight == WeightFormat::Nvfp4) {
      set(b + ".weight_scale", random_bytes(DType::F8_E4M3, {out, in / 16}, rng_, 0x20, 0x60));
      const float ws2 = next_scale(0.001f);
      set(b + ".weight_scale_2", scalar_f32(ws2));
      set(b + ".input_scale_2", scalar_f32(next_scale(0.01f)));
    } else if (s.weight == WeightFormat::Int8 || s.weight == WeightFormat::Fp8E4M3) {
      if (s.weight_scale == WeightScale::PerTensor) {
        set(b + ".weight_scale", scalar_f32(next_scale(0.01f)));
        if (s.weight == WeightFormat::Int8) set(b + ".weight_zero_point", scalar_i8(0));
      } else {
        std::vector<float> v(static_cast<size_t>(out));
        for (float& x : v) x = next_scale(0.01f);
        set(b + ".weight_scale", Tensor::from_f32(v, {out}));
        if (s.weight == WeightFormat::Int8) set(b + ".weight_zero_point", Tensor::zeros(DType::I8, {out}));
      }
      if (stat) {
        set(b + ".input_scale", scalar_f32(next_scale(0.05f)));
        if (s.weight == WeightFormat::Int8) set(b + ".input_zero_point", scalar_i8(0));
      }
    }
    if (cfg.expert_bias) {
      std::vector<float> v(static_cast<size_t>(out));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& x : v) x = nd(rng_);
      set(b + ".bias", bf16_tensor(v, {out}));
    }
  }

  float next_scale(float around) {
    std::uniform_real_distribution<float> d(0.5f, 1.5f);
    return around * d(rng_);
  }

  void set(const std::string& name, Tensor t) {
    for (auto& nt : tensors)
      if (nt.name == name) {
        nt.tensor = std::move(t);
        return;
      }
    tensors.push_back({name, std::move(t)});
  }
  void erase(const std::string& name) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [&](const NamedTensor& t) { return t.name == name; }),
                  tensors.end());
  }
  const Tensor& get(const std::string& name) const {
    for (const auto& nt : tensors)
      if (nt.name == name) return nt.tensor;
    throw std::runtime_error("synthetic model has no tensor " + name);
  }

  // Write the checkpoint and load the experts (the directory is removed afterwards: the
  // parameters own their bytes).
  ExpertParams load(const LoadOptions& o = {}) const {
    TempDir dir("synthetic");
    write_safetensors((dir.path() / "model.safetensors").string(), tensors);
    const Checkpoint ckpt = Checkpoint::open(dir.str());
    return load_expert_params(ckpt, cfg, scheme, 0, o);
  }

  ModelConfig cfg;
  LayerScheme scheme;
  std::vector<NamedTensor> tensors;

 private:
  std::mt19937 rng_;
};

}  // namespace qmoe::test
