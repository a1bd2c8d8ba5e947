// Internal helpers shared by the QuarkMoEMethod re-implementations (src/methods/*.cc): checkpoint
// tensor lookup and validation, TP slicing / placement into the per-rank parameters, and the
// per-method entry points dispatched by params_common.cc.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/params.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"
#include "qmoe/tensor.h"

namespace qmoe::methods {

// Which checkpoint projection of an expert is loaded.
enum class Shard {
  Gate,    // w1 / gate_proj: [I, H] → w13 rows [0, I_p)
  Up,      // w3 / up_proj:   [I, H] → w13 rows [I_p, 2·I_p)
  Down,    // w2 / down_proj: [H, I] → w2 columns (the intermediate is the input dim)
  GateUp,  // gpt-oss gate_up_proj: [2I, H], rows interleaved (2j gate_j, 2j+1 up_j) → w13 rows [0, 2·I_p)
};
std::string_view shard_label(Shard s);  // "gate (w1)", "up (w3)", "down (w2)", "gate_up"
inline bool is_w13(Shard s) { return s != Shard::Down; }

// This rank's slice [start, start + len) of the intermediate dimension (in elements of I).
struct InterSlice {
  int64_t start = 0;
  int64_t len = 0;
};

// One projection of one expert being loaded from the checkpoint.
struct ProjSource {
  const Checkpoint* ckpt = nullptr;
  std::string base;  // e.g. "model.layers.0.mlp.experts.5.up_proj"
  Shard shard = Shard::Gate;
  int local = 0;   // local expert id (index into the parameters)
  int global = 0;  // global expert id
  int64_t hidden = 0;      // H
  int64_t inter_full = 0;  // I (checkpoint, unsliced)
  InterSlice slice;        // this rank's intermediate slice
  int tp_rank = 0;

  std::string name(std::string_view suffix) const { return base + "." + std::string(suffix); }
  // Logical [out, in] of the checkpoint Linear.
  int64_t out_dim() const;
  int64_t in_dim() const;
};

// How the columns (the input dimension) of a stored 2-D tensor map to bytes: elements [a, b) are
// bytes [a·num/den, b·num/den); slice boundaries must be multiples of `align` elements.
struct ColLayout {
  int64_t num = 1;
  int64_t den = 1;
  int64_t align = 1;
  std::string_view what = "";  // e.g. "fp4 packing", "MX scale block" (for messages)
};
ColLayout weight_col_layout(WeightFormat f);  // packed element bytes of the stored weight
ColLayout block_scale_col_layout(WeightFormat f);  // MX 1/32, NVFP4 1/16 (one byte per block)
inline constexpr ColLayout kF32Cols{4, 1, 1, "fp32"};

// ---- checkpoint access ---------------------------------------------------------------------
bool has_tensor(const ProjSource& src, std::string_view suffix);
// The tensor `src.name(suffix)`; absent: qmoe::Error "tensor '…' is missing from checkpoint …".
Tensor fetch(const ProjSource& src, std::string_view suffix, std::string_view needed_for);
void expect_dtype(const Tensor& t, const std::string& name, std::initializer_list<DType> allowed,
                  std::string_view what);
void expect_shape(const Tensor& t, const std::string& name, const Shape& expected, std::string_view what);
// Float dtypes accepted for scales / biases / unquantized weights (converted exactly to fp32).
inline constexpr std::initializer_list<DType> kFloatDTypes = {DType::F32, DType::BF16, DType::F16};
// Scale validation (messages name the tensor and the element): float scales finite and > 0; E8M0
// bytes not 255 (NaN); FP8 E4M3 block scales (NVFP4) finite and >= 0 (an all-zero block has scale 0).
void check_positive_scales(const float* v, int64_t n, const std::string& name, std::string_view what);
void check_e8m0_scales(const Tensor& t, const std::string& name, std::string_view what);
void check_fp8_block_scales(const Tensor& t, const std::string& name, std::string_view what);
// A per-tensor scale: shape [] or [1] (numel > 1 is an error), float dtype → exact fp32, finite
// and > 0 (check_positive_scales).
float fetch_scalar(const ProjSource& src, std::string_view suffix, std::string_view what);
// A per-tensor I8 zero point ([] or [1]).
int8_t fetch_scalar_i8(const ProjSource& src, std::string_view suffix, std::string_view what);
// Convert a validated float tensor to an owning F32 tensor of the same shape.
Tensor as_f32(const Tensor& t, const std::string& name);

// ---- placement -----------------------------------------------------------------------------
// Copy this rank's slice of the validated 2-D checkpoint tensor `t` ([out, cols], row-major, columns
// per `layout`) into param[src.local] ([E_loc, rows, cols_p]): gate / up / gate_up rows are
// sliced and placed in their half of w13, down is sliced along its columns.
void place_slice(const ProjSource& src, const Tensor& t, const ColLayout& layout, Tensor& param);
// Same for a 1-D per-output-row tensor ([out]: per-channel scales, zero points, biases): w13 shards
// are sliced like rows; down ([H]) is copied whole.
void place_rows_1d(const ProjSource& src, const Tensor& t, Tensor& param);
// Per-tensor value: gate → param[local, 0], up → param[local, 1], gate_up → both, down → param[local].
void place_per_tensor_f32(const ProjSource& src, float v, Tensor& param);
void place_per_tensor_i8(const ProjSource& src, int8_t v, Tensor& param);

// ---- shared loaders ------------------------------------------------------------------------
// Weight of any packed / byte format: dtype `dtype`, shape [out, stored cols].
void load_weight_bytes(ExpertParams& p, const ProjSource& src, DType dtype);
// Float weight_scale of W8A8 schemes (per-tensor scalar or per-channel [out]).
void load_float_weight_scale(ExpertParams& p, const ProjSource& src);
// Static activation scale `suffix` ("input_scale" / "input_scale_2") into w13_input_scale (whole
// row: the last shard loaded wins) or w2_input_scale.
void load_static_input_scale(ExpertParams& p, const ProjSource& src, std::string_view suffix);
// Bias [out] (float) into w13_bias / w2_bias (w2 only on tp_rank 0).
void load_bias(ExpertParams& p, const ProjSource& src);

// ---- shared processing ---------------------------------------------------------------------
// Max over experts of the static activation scales (warning when they differ); the tensors become
// F32 [] scalars; returns the maxima (must be positive and finite).
struct StaticMax {
  float a13 = 0.0f;
  float a2 = 0.0f;
};
StaticMax reduce_static_input_scales(ExpertParams& p, std::string_view scale_name);
// Per-tensor w13 merge: s_max[e] = max(s_w1, s_w3); every code c of shard k is replaced by
// requant(c, s_k, s_max); w13_weight_scale becomes [E_loc]. (gpt-oss: one shard, no requant.)
using RequantFn = uint8_t (*)(uint8_t code, float s_shard, float s_max);
void merge_per_tensor_w13(ExpertParams& p, RequantFn requant);

// ---- per-method entry points (one file each) -----------------------------------------------
void create_ocp_mx(ExpertParams& p);
void load_ocp_mx(ExpertParams& p, const ProjSource& src);
void process_ocp_mx(ExpertParams& p);

void create_nvfp4(ExpertParams& p);
void load_nvfp4(ExpertParams& p, const ProjSource& src);
void process_nvfp4(ExpertParams& p);

void create_w8a8_int8(ExpertParams& p);
void load_w8a8_int8(ExpertParams& p, const ProjSource& src);
void process_w8a8_int8(ExpertParams& p);

void create_w8a8_fp8(ExpertParams& p);
void load_w8a8_fp8(ExpertParams& p, const ProjSource& src);
void process_w8a8_fp8(ExpertParams& p);

void create_unquantized(ExpertParams& p);
// Before the first load: the weight parameters take the dtype of `first`'s weight tensor.
void adopt_unquantized_dtype(ExpertParams& p, const ProjSource& first);
void load_unquantized(ExpertParams& p, const ProjSource& src);

// Helpers for messages.
std::string expert_desc(const ExpertParams& p, int local);  // "expert 5 of model.layers.0.mlp.experts"
bool stores_packed(WeightFormat f);                           // MX / NVFP4
int64_t packed_bytes(WeightFormat f, int64_t n);             // stored bytes of n elements along K

}  // namespace qmoe::methods
