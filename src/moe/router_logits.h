// Router logits on fp32 arrays (the arithmetic of compute_router_logits, include/qmoe/moe.h):
// logits[t·E + e] = fl32(Σ_h fl32(x[t, h] · w[e, h]) in fp64 (+ b[e])).
#pragma once

#include <cstdint>

namespace qmoe::detail {

void router_logits_f32(const float* x, int T, int H, const float* w, int64_t E, const float* b, float* logits);

}  // namespace qmoe::detail
