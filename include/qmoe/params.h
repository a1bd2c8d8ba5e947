// Expert parameters of one MoE layer, laid out exactly as the seed's QuarkMoEMethod subclasses
// create them (spec quark-moe.md §6), loaded from a checkpoint with TP/EP sharding (§7) and
// post-processed as `process_weights_after_loading` does (§6, decisions §16).
#pragma once

#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"
#include "qmoe/tensor.h"

namespace qmoe {

struct LoadOptions {
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;   // expert parallel: rank r of ep_size owns a contiguous range of global experts:
  int ep_size = 1;   //   base = E / ep_size, the first E % ep_size ranks own base + 1 (vLLM's split;
                     //   [r·E/ep_size, (r+1)·E/ep_size) when E divides)
  std::vector<int> expert_map;  // optional explicit global → local map [E] (−1 = not local, the others a
                                // permutation of 0..E_loc−1); overrides ep_*
};

// LoadOptions' EP split as a global → local map [E] (−1: not on rank ep_rank). ep_size > E: qmoe::Error.
std::vector<int> ep_expert_map(int num_experts, int ep_rank, int ep_size);

// The activation between the GEMMs.
struct ActivationSpec {
  Activation kind = Activation::Silu;
  bool interleaved = false;            // gpt-oss: w13 rows 2j = gate_j, 2j+1 = up_j
  float alpha = 1.702f;                // swigluoai
  std::optional<float> limit;          // swigluoai 7.0; for silu an optional swiglu_limit
};
// The activation of a model's MoE layers (cfg.activation, swiglu_alpha, swiglu_limit); `interleaved`:
// w13 rows alternate gate / up (gpt-oss). The one source of the spec for the loader and calibration.
ActivationSpec activation_spec_of(const ModelConfig& cfg, bool interleaved);

// Parameters of the routed experts (or of a shared expert: E = 1) of one layer, on one rank.
// Shapes are the seed's parameter shapes; packed(d) = d/2 (fp4) or 3d/4 (fp6).
struct ExpertParams {
  const SchemeInfo* scheme = nullptr;
  MxScaleMode act_scale_mode = MxScaleMode::Even;  // MX activation scale rule
  ActivationSpec act;
  int num_experts = 0;          // E (global)
  int num_local = 0;            // E_loc
  std::vector<int> expert_map;  // [E] global → local id, −1 when not on this rank
  std::vector<int> local_to_global;  // [E_loc]
  int hidden = 0;               // H
  int inter = 0;                // I_p: this rank's intermediate slice
  int inter_full = 0;           // I before TP slicing
  int tp_rank = 0, tp_size = 1;
  std::string prefix;           // checkpoint prefix of these experts (e.g. "model.layers.3.mlp.experts"), for messages

  // [E_loc, 2·I_p, packed(H)]: U8 fp4 pairs (even element in the low nibble) / fp6 4-in-3 bytes (MX,
  // NVFP4); I8 (INT8); F8_E4M3 (FP8); unquantized: the checkpoint's own dtype, BF16 / F16 / F32
  // (exactly the stored bytes; F32 when the tensors mix dtypes; BF16 from create_expert_params).
  // Rows: gate then up (interleaved for gpt-oss).
  Tensor w13_weight;
  // [E_loc, H, packed(I_p)], same element formats.
  Tensor w2_weight;
  // MX: U8 E8M0 [E_loc, 2·I_p, H/32]; NVFP4: F8_E4M3 [E_loc, 2·I_p, H/16];
  // per-channel: F32 [E_loc, 2·I_p]; per-tensor: F32 [E_loc, 2] ([e,0] = w1, [e,1] = w3; gpt-oss's
  // fused gate_up_proj scale is written to both), after processing F32 [E_loc] (w13 requantized to
  // the max). Undefined for unquantized.
  Tensor w13_weight_scale;
  // MX: U8 [E_loc, H, I_p/32]; NVFP4: F8_E4M3 [E_loc, H, I_p/16]; per-channel F32 [E_loc, H];
  // per-tensor F32 [E_loc].
  Tensor w2_weight_scale;
  // NVFP4 weight_scale_2 (dequant multiplier): F32 [E_loc, 2] → [E_loc] after processing; w2 [E_loc].
  Tensor w13_weight_scale_2, w2_weight_scale_2;
  // Static activation scales (fp8 / int8 static, MX a_fp8: input_scale; NVFP4: input_scale_2):
  // F32 [E_loc] (NVFP4 w13: [E_loc, 2] whose whole row each of w1 / w3 writes — the last wins).
  // After processing: F32 [] holding the max over experts (dequantization direction).
  Tensor w13_input_scale, w2_input_scale;
  // INT8 zero points as loaded (I8, shapes of the scales); dropped by processing.
  Tensor w13_weight_zero_point, w2_weight_zero_point, w13_input_zero_point, w2_input_zero_point;
  // Biases, F32 [E_loc, 2·I_p] / [E_loc, H]; undefined when the model has none. w2_bias is zero
  // on TP ranks ≠ 0 so it is added exactly once (§16.5).
  Tensor w13_bias, w2_bias;

  bool processed = false;
  // After processing: static activation scales as scalars. Dequantization direction for
  // fp8 / int8 / MX a_fp8; for NVFP4 these are the quantization-direction global scales
  // gs = 1 / max(input_scale_2).
  float a13_scale = 0.0f;
  float a2_scale = 0.0f;
  std::vector<std::string> warnings;  // e.g. input scales that differ across experts

  int rows13() const { return 2 * inter; }
};

// Allocate the parameters of `scheme` for E experts (E_loc local), hidden H, per-rank
// intermediate I_p, as the seed's create_weights does (MX scales initialised to 1, the rest 0).
// `expert_map` as LoadOptions::expert_map; empty: all E experts local. Sizes that do not fit the
// scheme's packing / block size (MX: H and I_p multiples of 32; NVFP4: of 16): qmoe::Error.
ExpertParams create_expert_params(const SchemeInfo& scheme, int num_experts, const std::vector<int>& expert_map,
                                  int hidden, int inter_per_rank, bool has_bias, const ActivationSpec& act);

// Create + load the routed experts of `layer` from `ckpt` (names per cfg.naming), TP-sliced and
// EP-mapped. Not yet processed. Missing tensors, wrong shapes or dtypes: qmoe::Error naming the
// tensor, the shape found and the shape expected.
ExpertParams load_expert_params(const Checkpoint& ckpt, const ModelConfig& cfg, const LayerScheme& scheme,
                                int layer, const LoadOptions& opt);
// Load a shared expert (E = 1, names `{prefix}.{gate,up,down}_proj.*`), TP-sliced like the experts.
ExpertParams load_shared_expert_params(const Checkpoint& ckpt, const ModelConfig& cfg, const LayerScheme& scheme,
                                       int layer, const LoadOptions& opt);

// process_weights_after_loading (§6 per method, §16.2, §16.4). Idempotent.
void process_expert_params(ExpertParams& p);

// Exact fp32 dequantization of local expert `e` as currently stored (before or after
// processing): w13 [2·I_p, H] row-major in parameter row order, w2 [H, I_p].
void dequant_expert(const ExpertParams& p, int local_expert, std::vector<float>& w13, std::vector<float>& w2);

}  // namespace qmoe
