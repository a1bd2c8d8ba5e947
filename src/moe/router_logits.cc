// Router logits = x · Wᵀ (+ bias): fp32 products, fp64 accumulation, rounded once to fp32.
#include <fmt/format.h>

#include <vector>

#include "moe/router_logits.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

namespace detail {

void router_logits_f32(const float* x, int T, int H, const float* w, int64_t E, const float* b, float* logits) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * H;
    for (int64_t e = 0; e < E; ++e) {
      const float* wr = w + e * H;
      double acc = 0.0;
      for (int h = 0; h < H; ++h) acc += static_cast<double>(xr[h] * wr[h]);
      if (b != nullptr) acc += static_cast<double>(b[e]);
      logits[static_cast<size_t>(t) * E + e] = static_cast<float>(acc);
    }
  }
}

}  // namespace detail

void compute_router_logits(const float* x, int T, int H, const Tensor& weight, const Tensor* bias, float* logits) {
  if (!weight.defined()) throw Error("compute_router_logits: the router weight is missing");
  if (weight.ndim() != 2 || weight.dim(1) != H)
    throw Error(fmt::format("compute_router_logits: router weight has shape {}; expected [E, {}]",
                            shape_str(weight.shape()), H));
  const int64_t E = weight.dim(0);
  if (T < 0) throw Error(fmt::format("compute_router_logits: token count T = {} is negative", T));
  if (T > 0 && (x == nullptr || logits == nullptr)) throw Error("compute_router_logits: x and logits must not be null");
  const std::vector<float> w = to_f32(weight, "router weight");
  std::vector<float> b;
  if (bias != nullptr && bias->defined()) {
    if (bias->numel() != E)
      throw Error(
          fmt::format("compute_router_logits: router bias has shape {}; expected [{}]", shape_str(bias->shape()), E));
    b = to_f32(*bias, "router bias");
  }
  detail::router_logits_f32(x, T, H, w.data(), E, b.empty() ? nullptr : b.data(), logits);
}

}  // namespace qmoe
