// Router logits on fp32 arrays for the optimized layer: logits[t·E + e] = fl32(Σ_h fl32(x[t, h] ·
// w[e, h]) in fp64 (+ b[e])), the products of compute_router_logits (include/qmoe/moe.h, the
// reference's sequential sum) summed in 32 interleaved fp64 partial sums so that it vectorises: the
// fp32 results agree except where the exact sum lies within ~2^-29 of an fp32 rounding boundary.
#pragma once

#include <cstdint>

namespace qmoe::detail {

void router_logits_f32(const float* x, int T, int H, const float* w, int64_t E, const float* b, float* logits);

}  // namespace qmoe::detail
