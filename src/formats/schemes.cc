#include "qmoe/schemes.h"

#include <fmt/format.h>

#include <array>
#include <string>

#include "qmoe/error.h"

namespace qmoe {

namespace {
using M = Method;
using W = WeightFormat;
using S = WeightScale;
using A = ActQuant;
// bits per weight: element bits + scale bits per element (MX: 8/32, NVFP4: 8/16; per-channel and
// per-tensor scales are negligible and not counted).
constexpr std::array<SchemeInfo, 20> kSchemes{{
    {"unquantized", M::Unquantized, W::BF16, S::None, A::None, 16.0, "bf16 experts (excluded from quantization)"},
    {"w_mxfp4", M::OcpMx, W::Mxfp4, S::MxE8M0, A::None, 4.25, "MXFP4 weights, bf16 activations (W4A16)"},
    {"w_mxfp4_a_mxfp4", M::OcpMx, W::Mxfp4, S::MxE8M0, A::Mxfp4, 4.25, "MXFP4 weights and dynamic MXFP4 activations"},
    {"w_mxfp4_a_mxfp6_e3m2", M::OcpMx, W::Mxfp4, S::MxE8M0, A::Mxfp6E3M2, 4.25, "MXFP4 weights, dynamic MXFP6 E3M2 activations"},
    {"w_mxfp4_a_mxfp6_e2m3", M::OcpMx, W::Mxfp4, S::MxE8M0, A::Mxfp6E2M3, 4.25, "MXFP4 weights, dynamic MXFP6 E2M3 activations"},
    {"w_mxfp4_a_fp8", M::OcpMx, W::Mxfp4, S::MxE8M0, A::Fp8Static, 4.25, "MXFP4 weights, static per-tensor FP8 activations"},
    {"w_mxfp6_e3m2", M::OcpMx, W::Mxfp6E3M2, S::MxE8M0, A::None, 6.25, "MXFP6 E3M2 weights, bf16 activations"},
    {"w_mxfp6_e3m2_a_mxfp6_e3m2", M::OcpMx, W::Mxfp6E3M2, S::MxE8M0, A::Mxfp6E3M2, 6.25, "MXFP6 E3M2 weights and activations"},
    {"w_mxfp6_e3m2_a_fp8", M::OcpMx, W::Mxfp6E3M2, S::MxE8M0, A::Fp8Static, 6.25, "MXFP6 E3M2 weights, static FP8 activations"},
    {"w_mxfp6_e2m3", M::OcpMx, W::Mxfp6E2M3, S::MxE8M0, A::None, 6.25, "MXFP6 E2M3 weights, bf16 activations"},
    {"w_mxfp6_e2m3_a_mxfp6_e2m3", M::OcpMx, W::Mxfp6E2M3, S::MxE8M0, A::Mxfp6E2M3, 6.25, "MXFP6 E2M3 weights and activations"},
    {"w_mxfp6_e2m3_a_fp8", M::OcpMx, W::Mxfp6E2M3, S::MxE8M0, A::Fp8Static, 6.25, "MXFP6 E2M3 weights, static FP8 activations"},
    {"nvfp4", M::Nvfp4, W::Nvfp4, S::Nvfp4, A::Nvfp4, 4.5, "NVFP4 W4A4: fp4 e2m1, fp8 e4m3 scale per 16, fp32 global scales"},
    {"w_int8_tensor_a_int8_static", M::W8A8Int8, W::Int8, S::PerTensor, A::Int8Static, 8.0, "INT8 per-tensor weights, static INT8 activations"},
    {"w_int8_tensor_a_int8_dyn_token", M::W8A8Int8, W::Int8, S::PerTensor, A::Int8DynToken, 8.0, "INT8 per-tensor weights, dynamic per-token INT8 activations"},
    {"w_int8_channel_a_int8_static", M::W8A8Int8, W::Int8, S::PerChannel, A::Int8Static, 8.0, "INT8 per-channel weights, static INT8 activations"},
    {"w_int8_channel_a_int8_dyn_token", M::W8A8Int8, W::Int8, S::PerChannel, A::Int8DynToken, 8.0, "INT8 per-channel weights, dynamic per-token INT8 activations"},
    {"w_fp8_tensor_a_fp8_static", M::W8A8Fp8, W::Fp8E4M3, S::PerTensor, A::Fp8Static, 8.0, "FP8 per-tensor weights, static FP8 activations"},
    {"w_fp8_tensor_a_fp8_dyn_tensor", M::W8A8Fp8, W::Fp8E4M3, S::PerTensor, A::Fp8DynTensor, 8.0, "FP8 per-tensor weights, dynamic per-tensor FP8 activations"},
    {"w_fp8_channel_a_fp8_dyn_token", M::W8A8Fp8, W::Fp8E4M3, S::PerChannel, A::Fp8DynToken, 8.0, "FP8 per-channel weights, dynamic per-token FP8 activations"},
}};

struct Alias {
  std::string_view alias, name;
};
constexpr std::array<Alias, 8> kAliases{{
    {"mxfp4", "w_mxfp4_a_mxfp4"},
    {"mxfp6", "w_mxfp6_e2m3_a_mxfp6_e2m3"},
    {"int8", "w_int8_channel_a_int8_dyn_token"},
    {"fp8", "w_fp8_tensor_a_fp8_static"},
    {"bf16", "unquantized"},
    {"w4a16", "w_mxfp4"},
    {"w4a4", "w_mxfp4_a_mxfp4"},
    {"ptpc_fp8", "w_fp8_channel_a_fp8_dyn_token"},
}};
}  // namespace

std::span<const SchemeInfo> all_schemes() { return kSchemes; }

const SchemeInfo* find_scheme(std::string_view name) {
  for (const auto& s : kSchemes)
    if (s.name == name) return &s;
  for (const auto& a : kAliases)
    if (a.alias == name) return find_scheme(a.name);
  return nullptr;
}

const SchemeInfo& scheme_by_name(std::string_view name) {
  if (const SchemeInfo* s = find_scheme(name)) return *s;
  std::string known;
  for (const auto& s : kSchemes) known += (known.empty() ? "" : ", ") + std::string(s.name);
  throw Error(fmt::format("unknown scheme '{}'; known schemes: {}", name, known));
}

std::string_view to_string(Method m) {
  switch (m) {
    case M::Unquantized: return "Unquantized";
    case M::W8A8Fp8: return "QuarkW8A8Fp8MoEMethod";
    case M::W8A8Int8: return "QuarkW8A8Int8MoEMethod";
    case M::OcpMx: return "QuarkOCP_MX_MoEMethod";
    case M::Nvfp4: return "QuarkNvfp4MoEMethod";
  }
  return "?";
}
std::string_view to_string(WeightFormat f) {
  switch (f) {
    case W::BF16: return "bf16";
    case W::Fp8E4M3: return "fp8_e4m3";
    case W::Int8: return "int8";
    case W::Mxfp4: return "mxfp4";
    case W::Mxfp6E2M3: return "mxfp6_e2m3";
    case W::Mxfp6E3M2: return "mxfp6_e3m2";
    case W::Nvfp4: return "nvfp4";
  }
  return "?";
}
std::string_view to_string(WeightScale s) {
  switch (s) {
    case S::None: return "none";
    case S::PerTensor: return "per_tensor";
    case S::PerChannel: return "per_channel";
    case S::MxE8M0: return "e8m0/32";
    case S::Nvfp4: return "e4m3/16+fp32";
  }
  return "?";
}
std::string_view to_string(ActQuant a) {
  switch (a) {
    case A::None: return "none";
    case A::Fp8Static: return "fp8_static";
    case A::Fp8DynTensor: return "fp8_dyn_tensor";
    case A::Fp8DynToken: return "fp8_dyn_token";
    case A::Int8Static: return "int8_static";
    case A::Int8DynToken: return "int8_dyn_token";
    case A::Mxfp4: return "mxfp4";
    case A::Mxfp6E2M3: return "mxfp6_e2m3";
    case A::Mxfp6E3M2: return "mxfp6_e3m2";
    case A::Nvfp4: return "nvfp4";
  }
  return "?";
}

bool is_mx_weight(WeightFormat f) { return f == W::Mxfp4 || f == W::Mxfp6E2M3 || f == W::Mxfp6E3M2; }
bool act_is_static(ActQuant a) { return a == A::Fp8Static || a == A::Int8Static || a == A::Nvfp4; }
bool act_is_quantized(ActQuant a) { return a != A::None; }
int weight_block_size(WeightFormat f) { return is_mx_weight(f) ? 32 : f == W::Nvfp4 ? 16 : 0; }

int64_t weight_packed_cols(WeightFormat f, int64_t cols) {
  switch (f) {
    case W::Mxfp4:
    case W::Nvfp4: return cols / 2;
    case W::Mxfp6E2M3:
    case W::Mxfp6E3M2: return cols * 3 / 4;
    default: return cols;
  }
}

}  // namespace qmoe
