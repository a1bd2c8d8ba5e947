// The scheme registry: the one place a quantization scheme is described (DESIGN principle 2).
// Tests, benchmarks, the quantizer and the CLI iterate it, so a new row is covered everywhere.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace qmoe {

// Which QuarkMoEMethod class of the seed handles the scheme.
enum class Method { Unquantized, W8A8Fp8, W8A8Int8, OcpMx, Nvfp4 };

// Stored expert weight element format.
enum class WeightFormat { BF16, Fp8E4M3, Int8, Mxfp4, Mxfp6E2M3, Mxfp6E3M2, Nvfp4 };

// Weight scale granularity.
enum class WeightScale {
  None,        // bf16
  PerTensor,   // one fp32 per (expert, projection); after load one per expert (w13 requantized)
  PerChannel,  // one fp32 per output row
  MxE8M0,      // one E8M0 byte per 32 input elements
  Nvfp4,       // one FP8 E4M3 per 16 input elements + fp32 per-tensor weight_scale_2
};

// How the inputs of GEMM1 and GEMM2 are quantized (the intermediate gets the same rule).
enum class ActQuant {
  None,           // bf16 / fp32 activations (weight-only)
  Fp8Static,      // fp8 e4m3, static per-tensor scale (max over experts)
  Fp8DynTensor,   // fp8 e4m3, dynamic per-tensor scale
  Fp8DynToken,    // fp8 e4m3, dynamic per-token scale
  Int8Static,     // int8, static per-tensor scale
  Int8DynToken,   // int8, dynamic per-token scale
  Mxfp4,          // dynamic MX fp4 e2m1 per 32 ("even" rule), quantize-dequantize
  Mxfp6E2M3,      // dynamic MX fp6 e2m3 per 32
  Mxfp6E3M2,      // dynamic MX fp6 e3m2 per 32
  Nvfp4,          // NVFP4 per 16 with static global scale 1/max(input_scale_2)
};

struct SchemeInfo {
  std::string_view name;        // canonical name, e.g. "w_mxfp4_a_mxfp4"
  Method method;
  WeightFormat weight;
  WeightScale weight_scale;
  ActQuant act;
  double bits_per_weight;       // stored bits per weight incl. block scales
  std::string_view description;
};

// All schemes, in a stable order.
std::span<const SchemeInfo> all_schemes();
// By canonical name or alias ("mxfp4" → w_mxfp4_a_mxfp4, "int8" → w_int8_channel_a_int8_dyn_token,
// "fp8" → w_fp8_tensor_a_fp8_static, "bf16" → unquantized). nullptr when unknown.
const SchemeInfo* find_scheme(std::string_view name);
// Like find_scheme, but throws qmoe::Error listing the known names.
const SchemeInfo& scheme_by_name(std::string_view name);

std::string_view to_string(Method m);
std::string_view to_string(WeightFormat f);
std::string_view to_string(WeightScale s);
std::string_view to_string(ActQuant a);

// Helpers.
bool is_mx_weight(WeightFormat f);
bool act_is_static(ActQuant a);      // needs stored input scales (fp8/int8 static, nvfp4 input_scale_2)
bool act_is_quantized(ActQuant a);   // anything but None
int weight_block_size(WeightFormat f);  // 32 for MX, 16 for NVFP4, 0 otherwise
// Columns of a stored weight row of `cols` elements: the packed bytes for FP4 (cols / 2) and FP6
// (cols · 3 / 4), one column per element otherwise (INT8 / FP8 bytes, unquantized elements).
int64_t weight_packed_cols(WeightFormat f, int64_t cols);

}  // namespace qmoe
