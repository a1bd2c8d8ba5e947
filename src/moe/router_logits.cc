// Router logits = x · Wᵀ (+ bias): fp32 products, fp64 accumulation, rounded once to fp32 — the
// reference's plain sequential loop (compute_router_logits) and the layer's vectorisable form
// (detail::router_logits_f32: the same products, the fp64 sum in 32 interleaved partial sums).
#include <fmt/format.h>

#include <vector>

#include "moe/router_logits.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

namespace detail {

// Compiled for AVX-512, AVX2 and the baseline and picked at load time (with GCC and no sanitizer;
// otherwise the baseline only): the same arithmetic in each, since the kLanes partial sums are
// kLanes independent fp64 chains whatever the vector width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void router_logits_f32(const float* x, int T, int H, const float* w, int64_t E, const float* b, float* logits) {
  // Expert-major (one weight row stays in L1 across the tokens), and each dot product in kLanes
  // interleaved fp64 partial sums added pairwise at the end, so that the compiler vectorises the
  // inner loop: the products are the same fp32 values, only the fp64 summation order differs (its
  // rounding is ~2^-29 of the fp32 result's last bit).
  constexpr int kLanes = 32;  // 4 AVX-512 / 8 AVX2 accumulators: enough independent add chains
  for (int64_t e = 0; e < E; ++e) {
    const float* wr = w + e * H;
    for (int t = 0; t < T; ++t) {
      const float* xr = x + static_cast<size_t>(t) * H;
      double part[kLanes] = {};
      int h = 0;
      for (; h + kLanes <= H; h += kLanes)
        for (int j = 0; j < kLanes; ++j) part[j] += static_cast<double>(xr[h + j] * wr[h + j]);
      for (int j = 0; h < H; ++h, ++j) part[j] += static_cast<double>(xr[h] * wr[h]);
      for (int n = kLanes / 2; n >= 1; n /= 2)  // pairwise, in a fixed order
        for (int j = 0; j < n; ++j) part[j] += part[j + n];
      double acc = part[0];
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
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * H;
    for (int64_t e = 0; e < E; ++e) {
      const float* wr = w.data() + e * H;
      double acc = 0.0;
      for (int h = 0; h < H; ++h) acc += static_cast<double>(xr[h] * wr[h]);
      if (!b.empty()) acc += static_cast<double>(b[static_cast<size_t>(e)]);
      logits[static_cast<size_t>(t) * E + e] = static_cast<float>(acc);
    }
  }
}

}  // namespace qmoe
