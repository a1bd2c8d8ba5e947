// Gated activations between GEMM1 and GEMM2 (spec quark-moe.md §9.3).
#include <algorithm>
#include <cmath>

#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"

namespace qmoe::ref {

namespace {
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
constexpr double kSqrtHalf = 0.70710678118654752440;     // 1/√2
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
}  // namespace

double activation_value(const ActivationSpec& act, double g, double u) {
  switch (act.kind) {
    case Activation::Silu:
      if (act.limit) {  // swiglu_limit: silu(min(g, L)) · clamp(u, −L, L)
        const double lim = *act.limit;
        g = std::min(g, lim);
        u = std::clamp(u, -lim, lim);
      }
      return g * sigmoid(g) * u;
    case Activation::Gelu:
      return 0.5 * g * (1.0 + std::erf(g * kSqrtHalf)) * u;
    case Activation::GeluTanh:
      return 0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * (g + 0.044715 * g * g * g))) * u;
    case Activation::SwigluOai: {
      const double lim = act.limit ? static_cast<double>(*act.limit) : 7.0;
      const double gc = std::min(g, lim);
      const double uc = std::clamp(u, -lim, lim);
      return (uc + 1.0) * gc * sigmoid(static_cast<double>(act.alpha) * gc);
    }
  }
  throw Error("unknown activation kind");
}

void apply_activation_row(const ActivationSpec& act, const float* y1, int inter, float* z) {
  for (int j = 0; j < inter; ++j) {
    const float g = act.interleaved ? y1[2 * j] : y1[j];
    const float u = act.interleaved ? y1[2 * j + 1] : y1[inter + j];
    z[j] = static_cast<float>(activation_value(act, g, u));
  }
}

}  // namespace qmoe::ref
