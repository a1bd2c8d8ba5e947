// The combine arithmetic of combine_kernel (moe_kernels.cu): out[t][h] (+)= Σ_k w[t,k] · (Σ_split
// y2p[split][t·K+k][h] + b2[e_k][h]) over the token's local routes, in the reference order — per
// route the splits in order, plus the bias, then the weighted sum over the routes in order; and
// the predicated load helpers the row kernels share (align, act).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace qmoe::cuda {

// A 4-byte global load the compiler issues where it stands (volatile asm: not sunk into the
// branch that uses it), so that a run of them is in flight together; `on` predicates it (`off`
// when off), so a run is one basic block with no branch per load.
template <class T>
__device__ __forceinline__ T ld_issue(const T* p, bool on, T off) {
  static_assert(sizeof(T) == 4, "32-bit loads");
  uint32_t v;
  memcpy(&v, &off, 4);
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.b32 %0, [%1];\n}\n"
               : "+r"(v)
               : "l"(p), "r"(static_cast<int>(on)));
  T r;
  memcpy(&r, &v, 4);
  return r;
}

// V consecutive floats at p (16-byte aligned for V = 4) by one predicated load (zeros when off),
// from L2 (.cg: the partials were written by the GEMM kernel before, on other SMs).
template <int V>
__device__ __forceinline__ void ld_partial(float (&x)[V], const float* p, bool on) {
  if constexpr (V == 4) {
    x[0] = x[1] = x[2] = x[3] = 0.0f;
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n@q ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n}\n"
                 : "+f"(x[0]), "+f"(x[1]), "+f"(x[2]), "+f"(x[3])
                 : "l"(p), "r"(static_cast<int>(on)));
  } else {
    x[0] = 0.0f;
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.cg.f32 %0, [%1];\n}\n"
                 : "+f"(x[0])
                 : "l"(p), "r"(static_cast<int>(on)));
  }
}

constexpr int kCombineIlp = 8;  // routes whose partial loads are in flight together

// acc[c] = Σ_k w_k · (Σ_s yt[s·split_stride + k·H + c] + b2[e_k·H + h + c]) for the token whose
// route k has local expert route(k) (< 0: not here) and weight weight(k) (unused when on_input);
// yt points at the token's first slot row, column h. kCombineIlp routes' loads in flight at a time.
template <int V, class Route, class Weight>
__device__ __forceinline__ void combine_sum(float (&acc)[V], const float* yt, int64_t split_stride, int ksplit,
                                            int K, int H, int h, Route route, Weight weight, const float* b2,
                                            bool on_input) {
#pragma unroll
  for (int c = 0; c < V; ++c) acc[c] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kCombineIlp) {
    float v[kCombineIlp][V], x[kCombineIlp][V];
    int le[kCombineIlp];
#pragma unroll
    for (int q = 0; q < kCombineIlp; ++q) {
#pragma unroll
      for (int c = 0; c < V; ++c) v[q][c] = 0.0f;
      le[q] = k0 + q < K ? route(k0 + q) : -1;
    }
    for (int s = 0; s < ksplit; ++s) {
#pragma unroll
      for (int q = 0; q < kCombineIlp; ++q)
        ld_partial<V>(x[q], yt + s * split_stride + static_cast<int64_t>(k0 + q) * H, le[q] >= 0);
#pragma unroll
      for (int q = 0; q < kCombineIlp; ++q)
        if (le[q] >= 0)
#pragma unroll
          for (int c = 0; c < V; ++c) v[q][c] += x[q][c];
    }
#pragma unroll
    for (int q = 0; q < kCombineIlp; ++q) {
      if (le[q] < 0) continue;
#pragma unroll
      for (int c = 0; c < V; ++c) {
        float vk = v[q][c];
        if (b2) vk += b2[static_cast<int64_t>(le[q]) * H + h + c];
        acc[c] += on_input ? vk : weight(k0 + q) * vk;
      }
    }
  }
}

// Stores V outputs at o (16-byte aligned for V = 4): NaN for a token flagged bad (non-finite
// hidden states, quant_input_kernel), else acc, added to what o holds when accumulating.
template <int V>
__device__ __forceinline__ void combine_store(float* o, const float (&acc)[V], bool bad, bool accumulate) {
  if (bad) {
#pragma unroll
    for (int c = 0; c < V; ++c) o[c] = __int_as_float(0x7FC00000);
    return;
  }
  if constexpr (V == 4) {
    float4* o4 = reinterpret_cast<float4*>(o);
    float4 r = make_float4(acc[0], acc[1], acc[2], acc[3]);
    if (accumulate) {
      const float4 p = *o4;
      r = make_float4(p.x + r.x, p.y + r.y, p.z + r.z, p.w + r.w);
    }
    *o4 = r;
  } else {
    *o = accumulate ? *o + acc[0] : acc[0];
  }
}

}  // namespace qmoe::cuda
