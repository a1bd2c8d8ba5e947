// Internal building blocks of the scalar reference (src/cpu/ref), shared with the optimized CPU
// kernels so that every kernel quantizes activations, applies the gated activation and decodes
// weights by the same definition (spec quark-moe.md §9, §10, §16.6).
#pragma once

#include <cstdint>
#include <vector>

#include "qmoe/formats.h"
#include "qmoe/params.h"
#include "qmoe/schemes.h"

namespace qmoe::ref {

// ---------------------------------------------------------------------------------------------
// Activation quantization of one GEMM input (per token row along the reduction dimension).
struct ActQuantRule {
  ActQuant kind = ActQuant::None;
  MxScaleMode mx_mode = MxScaleMode::Even;  // MX activations
  // Fp8Static / Int8Static: the dequantization-direction static scale s (x ≈ q·s).
  // Nvfp4: the quantization-direction global scale gs (= 1 / max(input_scale_2)).
  float static_scale = 0.0f;
};

// The rule for the GEMM1 input (p.a13_scale) and for the GEMM2 input (p.a2_scale) of processed
// parameters. Throws qmoe::Error when a static scale the scheme needs is missing (≤ 0 or not finite).
ActQuantRule gemm1_act_rule(const ExpertParams& p);
ActQuantRule gemm2_act_rule(const ExpertParams& p);

// Max |x| over n values (NaN propagates as NaN).
float abs_max(const float* x, int64_t n);

// Fp8DynTensor: the per-tensor scale fp8_tensor_scale(absmax) of the whole GEMM input; 0 for the
// other rules (they ignore it).
float act_tensor_scale(const ActQuantRule& r, float tensor_absmax);

// Quantize-dequantize one row x[0..n) with rule r (for Fp8DynTensor with `tensor_scale`).
// The double version returns the exact value q·s of every element (products of an fp8 / int8
// code and an fp32 scale need up to 32 significant bits); the float version rounds that value to
// fp32 once. MX and NVFP4 values are computed by the formats.h block functions (fp32).
void act_qdq_row(const ActQuantRule& r, const float* x, int n, float tensor_scale, double* out);
void act_qdq_row(const ActQuantRule& r, const float* x, int n, float tensor_scale, float* out);

// ---------------------------------------------------------------------------------------------
// Gated activation between the GEMMs (spec §9.3). y1: one GEMM1 output row of 2·inter values
// (gate rows [0, inter) then up rows [inter, 2·inter); interleaved: gate_j = y1[2j], up_j = y1[2j+1]).
// z: inter values. Computed in double from the fp32 inputs, rounded once to fp32.
void apply_activation_row(const ActivationSpec& act, const float* y1, int inter, float* z);
// One element: gate g, up u.
double activation_value(const ActivationSpec& act, double g, double u);

// ---------------------------------------------------------------------------------------------
// Weight decoding (exact fp32 values of processed parameters; spec §16.6).
enum class Proj { W13, W2 };

// Checks that the weight / scale tensors of `p` have the shapes and dtypes the scheme needs
// (processed layout), so decoding can never read out of bounds. Throws qmoe::Error naming the field.
void validate_expert_params(const ExpertParams& p, const char* who);

// All rows of one projection of local expert e, row-major: W13 → [2·inter, hidden], W2 → [hidden, inter].
// Each value is the fp32 product element × scale, rounded once (MX: element · 2^(s−127), exact;
// NVFP4: (e2m1 · fp8(block scale)) · weight_scale_2, the first product exact — the values of the
// conformance `dequant.<e>` tensors).
void decode_weight(const ExpertParams& p, Proj which, int local_expert, std::vector<float>& out);
// The bias row of local expert e (W13 → 2·inter values, W2 → hidden values) as fp32; zeros when
// the parameters have no bias.
void decode_bias(const ExpertParams& p, Proj which, int local_expert, std::vector<float>& out);

}  // namespace qmoe::ref
