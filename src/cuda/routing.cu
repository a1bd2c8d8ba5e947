// Device routing: router logits → top-k expert ids and weights, the semantics of qmoe::route
// (src/moe/routing.cc, spec §8) on the GPU, stream-ordered and capturable, so that a layer runs
// from logits to output without a host round trip.
//
// A warp per token (experts in registers, no block barriers) for E ≤ 1024 and n_group ≤ 32;
// otherwise one CTA per token, the token's E logits in shared memory. Every top-k is an iterative argmax
// over a fixed reduction tree whose ties go to the lower id (as the CPU's scan), so the ids equal
// route()'s wherever no two candidates round to the same fp32 score, and reruns are bit-identical.
// Sums (the softmax denominator) use a fixed tree too: the weights may differ from route()'s by
// fp32 rounding (≤ a few ulps); the renormalisation over the k selected weights and the scaling
// run sequentially in k order, as on the CPU.
// Non-finite logits are not an error here (no host check on the device path): the token gets
// expert ids 0..K−1 with NaN weights, so that its output row becomes NaN, never finite garbage
// (docs/DECISIONS.md); checked entry points refuse such inputs before launching.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/launch.cuh"
#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe::cuda {
namespace {

constexpr int kRouteThreads = 256;
constexpr int kMaxRouteExperts = 8192;  // shared memory: 2 floats per expert
constexpr int kMaxRouteGroups = 256;

struct RouteArgs {
  const void* logits = nullptr;
  XType lt = XType::F32;
  const float* bias = nullptr;  // [E] or null
  int E = 0, K = 0;
  int scoring_sigmoid = 0, renormalize = 1, topk_then_softmax = 0;
  int n_group = 0, topk_group = 0;
  float scale = 1.0f;
  int32_t* ids = nullptr;
  float* weights = nullptr;
};

__device__ __forceinline__ float load_logit(const RouteArgs& a, int64_t i) {
  switch (a.lt) {
    case XType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(a.logits)[i]);
    case XType::F16: return __half2float(static_cast<const __half*>(a.logits)[i]);
    default: return static_cast<const float*>(a.logits)[i];
  }
}

// (value, index) argmax over the block; ties → lower index. Every thread gets the result.
struct Best {
  float v;
  int i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}
__device__ Best block_argmax(Best b, Best* red) {
  for (int o = 16; o > 0; o >>= 1) {
    Best x{__shfl_down_sync(0xFFFFFFFFu, b.v, o), __shfl_down_sync(0xFFFFFFFFu, b.i, o)};
    b = better(b, x);
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) red[w] = b;
  __syncthreads();
  if (w == 0) {
    b = l < kRouteThreads / 32 ? red[l] : Best{-INFINITY, -1};
    for (int o = 16; o > 0; o >>= 1) {
      Best x{__shfl_down_sync(0xFFFFFFFFu, b.v, o), __shfl_down_sync(0xFFFFFFFFu, b.i, o)};
      b = better(b, x);
    }
    if (l == 0) red[0] = b;
  }
  __syncthreads();
  return red[0];
}
__device__ float block_reduce(float v, bool is_max, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float x = __shfl_down_sync(0xFFFFFFFFu, v, o);
    v = is_max ? fmaxf(v, x) : v + x;
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < kRouteThreads / 32 ? red[l] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float x = __shfl_down_sync(0xFFFFFFFFu, v, o);
      v = is_max ? fmaxf(v, x) : v + x;
    }
    if (l == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// Top-k of c[0..n) into out (selection order), marking the chosen entries −∞ in c.
__device__ void block_topk(float* c, int n, int k, int32_t* out, Best* red) {
  for (int j = 0; j < k; ++j) {
    Best b{-INFINITY, -1};
    for (int i = threadIdx.x; i < n; i += kRouteThreads) b = better(b, Best{c[i], i});
    b = block_argmax(b, red);
    if (threadIdx.x == 0) {
      out[j] = b.i;
      c[b.i] = -INFINITY;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const RouteArgs a) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ float sm[];
  float* score = sm;         // [E] scores (softmax / sigmoid / logits)
  float* choice = sm + a.E;  // [E] selection values
  __shared__ Best red[32];
  __shared__ float fred[32];
  __shared__ int32_t sel[kMaxRouteGroups];
  __shared__ float gscore[kMaxRouteGroups];
  __shared__ int bad;
  const int t = blockIdx.x, E = a.E, K = a.K;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kRouteThreads) {
    const float l = load_logit(a, static_cast<int64_t>(t) * E + e);
    if (!isfinite(l)) bad = 1;
    score[e] = l;
  }
  __syncthreads();
  int32_t* ids = a.ids + static_cast<int64_t>(t) * K;
  float* w = a.weights + static_cast<int64_t>(t) * K;
  if (bad) {
    for (int k = threadIdx.x; k < K; k += kRouteThreads) {
      ids[k] = k;
      w[k] = NAN;
    }
    return;
  }
  if (a.topk_then_softmax) {
    for (int e = threadIdx.x; e < E; e += kRouteThreads) choice[e] = a.bias ? score[e] + a.bias[e] : score[e];
    __syncthreads();
    block_topk(choice, E, K, sel, red);
    if (threadIdx.x == 0) {  // softmax over the k selected logits, in k order (as the CPU)
      float m = score[sel[0]];
      for (int k = 1; k < K; ++k) m = fmaxf(m, score[sel[k]]);
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += expf(score[sel[k]] - m);
      for (int k = 0; k < K; ++k) {
        ids[k] = sel[k];
        w[k] = expf(score[sel[k]] - m) / s * a.scale;
      }
    }
    return;
  }
  if (a.scoring_sigmoid) {
    for (int e = threadIdx.x; e < E; e += kRouteThreads) score[e] = 1.0f / (1.0f + expf(-score[e]));
  } else {
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) m = fmaxf(m, score[e]);
    m = block_reduce(m, true, fred);
    float s = 0.0f;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
      score[e] = expf(score[e] - m);
      s += score[e];
    }
    s = block_reduce(s, false, fred);
    for (int e = threadIdx.x; e < E; e += kRouteThreads) score[e] = score[e] / s;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kRouteThreads) choice[e] = a.bias ? score[e] + a.bias[e] : score[e];
  __syncthreads();
  if (a.n_group > 1 && a.topk_group < a.n_group) {
    const int G = a.n_group, gs = E / G;
    for (int g = threadIdx.x; g < G; g += kRouteThreads) {  // one thread a group, in expert order
      const float* c = choice + g * gs;
      float v;
      if (a.bias) {  // sum of the group's two best (ties → lower id), as the CPU
        int b0 = 0;
        for (int j = 1; j < gs; ++j)
          if (c[j] > c[b0]) b0 = j;
        v = c[b0];
        if (gs >= 2) {
          int b1 = -1;
          for (int j = 0; j < gs; ++j)
            if (j != b0 && (b1 < 0 || c[j] > c[b1])) b1 = j;
          v += c[b1];
        }
      } else {
        v = c[0];
        for (int j = 1; j < gs; ++j) v = c[j] > v ? c[j] : v;
      }
      gscore[g] = v;
    }
    __syncthreads();
    block_topk(gscore, G, a.topk_group, sel, red);  // gscore of kept groups becomes −∞
    for (int e = threadIdx.x; e < E; e += kRouteThreads)
      if (gscore[e / gs] != -INFINITY) choice[e] = -INFINITY;  // not a kept group
    __syncthreads();
  }
  block_topk(choice, E, K, sel, red);
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += score[sel[k]];
    for (int k = 0; k < K; ++k) {
      float v = score[sel[k]];
      if (a.renormalize && sum > 0.0f) v = v / sum;
      ids[k] = sel[k];
      w[k] = a.scale != 1.0f ? v * a.scale : v;
    }
  }
}

// ---- warp per token (E ≤ 32·V, n_group ≤ 32): no block barriers --------------------------------
// Lane l holds experts e = j·32 + l (j < V). Same semantics and tie rules as route_kernel: every
// argmax prefers the larger value, then the lower index; sums are per lane in j order, then a
// fixed xor tree (deterministic).
constexpr int kWarpTokens = 4;  // tokens (warps) per CTA

struct WBest {
  float v;
  int i;
  float s;  // the candidate's score (carried to the winner)
};
__device__ __forceinline__ WBest wbetter(WBest a, WBest b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}
__device__ __forceinline__ WBest warp_argmax(WBest b) {
  for (int o = 16; o > 0; o >>= 1) {
    WBest x{__shfl_xor_sync(0xFFFFFFFFu, b.v, o), __shfl_xor_sync(0xFFFFFFFFu, b.i, o),
            __shfl_xor_sync(0xFFFFFFFFu, b.s, o)};
    b = wbetter(b, x);
  }
  return b;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return __shfl_sync(0xFFFFFFFFu, v, 0);  // lanes add in different orders: all take lane 0's sum
}
__device__ __forceinline__ float warp_fmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Top-k of c (lane-held, V per lane) into ids / score-of-winner (lane 0's registers via smem);
// winners are set to −∞ in c.
template <int V>
__device__ __forceinline__ void warp_topk(float (&c)[V], const float (&sc)[V], int E, int k, int32_t* out_i,
                                          float* out_s) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < k; ++j) {
    WBest b{-INFINITY, -1, 0.0f};
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int e = q * 32 + lane;
      if (e < E) b = wbetter(b, WBest{c[q], e, sc[q]});
    }
    b = warp_argmax(b);
    if (lane == 0) {
      out_i[j] = b.i;
      out_s[j] = b.s;
    }
#pragma unroll
    for (int q = 0; q < V; ++q)
      if (q * 32 + lane == b.i) c[q] = -INFINITY;
  }
}

template <int V>
__global__ void __launch_bounds__(32 * kWarpTokens) route_warp_kernel(const RouteArgs a, int T) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  __shared__ int32_t s_id[kWarpTokens][kMaxRouteGroups];
  __shared__ float s_sc[kWarpTokens][kMaxRouteGroups];
  const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarpTokens + wi;
  if (t >= T) return;
  const int E = a.E, K = a.K;
  float l[V], sc[V], c[V];
  bool ok = true;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const int e = q * 32 + lane;
    l[q] = e < E ? load_logit(a, static_cast<int64_t>(t) * E + e) : 0.0f;
    if (!isfinite(l[q])) ok = false;
  }
  int32_t* ids = a.ids + static_cast<int64_t>(t) * K;
  float* w = a.weights + static_cast<int64_t>(t) * K;
  if (!__all_sync(0xFFFFFFFFu, ok)) {
    for (int k = lane; k < K; k += 32) {
      ids[k] = k;
      w[k] = NAN;
    }
    return;
  }
  int32_t* si = s_id[wi];
  float* ss = s_sc[wi];
  if (a.topk_then_softmax) {
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int e = q * 32 + lane;
      c[q] = e < E ? (a.bias ? l[q] + a.bias[e] : l[q]) : -INFINITY;
    }
    warp_topk<V>(c, l, E, K, si, ss);  // ss = the selected logits
    __syncwarp();
    if (lane == 0) {
      float m = ss[0];
      for (int k = 1; k < K; ++k) m = fmaxf(m, ss[k]);
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += expf(ss[k] - m);
      for (int k = 0; k < K; ++k) {
        ids[k] = si[k];
        w[k] = expf(ss[k] - m) / s * a.scale;
      }
    }
    return;
  }
  if (a.scoring_sigmoid) {
#pragma unroll
    for (int q = 0; q < V; ++q) sc[q] = 1.0f / (1.0f + expf(-l[q]));
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int q = 0; q < V; ++q)
      if (q * 32 + lane < E) m = fmaxf(m, l[q]);
    m = warp_fmax(m);
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < V; ++q) {
      sc[q] = q * 32 + lane < E ? expf(l[q] - m) : 0.0f;
      s += sc[q];
    }
    s = warp_sum(s);
#pragma unroll
    for (int q = 0; q < V; ++q) sc[q] = sc[q] / s;
  }
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const int e = q * 32 + lane;
    c[q] = e < E ? (a.bias ? sc[q] + a.bias[e] : sc[q]) : -INFINITY;
  }
  if (a.n_group > 1 && a.topk_group < a.n_group) {
    const int G = a.n_group, gs = E / G;
    float gsc = -INFINITY;  // lane g: score of group g
    for (int g = 0; g < G; ++g) {
      WBest b0{-INFINITY, -1, 0.0f};
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const int e = q * 32 + lane;
        if (e < E && e / gs == g) b0 = wbetter(b0, WBest{c[q], e, 0.0f});
      }
      b0 = warp_argmax(b0);
      float v = b0.v;
      if (a.bias && gs >= 2) {  // plus the second best of the group
        WBest b1{-INFINITY, -1, 0.0f};
#pragma unroll
        for (int q = 0; q < V; ++q) {
          const int e = q * 32 + lane;
          if (e < E && e / gs == g && e != b0.i) b1 = wbetter(b1, WBest{c[q], e, 0.0f});
        }
        b1 = warp_argmax(b1);
        v = v + b1.v;
      }
      if (lane == g) gsc = v;
    }
    // Kept groups: top-topk_group of the group scores (lane g holds group g).
    bool kept = false;
    for (int j = 0; j < a.topk_group; ++j) {
      WBest b = warp_argmax(lane < G ? WBest{gsc, lane, 0.0f} : WBest{-INFINITY, -1, 0.0f});
      if (lane == b.i) {
        kept = true;
        gsc = -INFINITY;
      }
    }
    const unsigned keep_mask = __ballot_sync(0xFFFFFFFFu, kept);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int e = q * 32 + lane;
      if (e < E && !((keep_mask >> (e / gs)) & 1u)) c[q] = -INFINITY;
    }
  }
  warp_topk<V>(c, sc, E, K, si, ss);
  __syncwarp();
  if (lane == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += ss[k];
    for (int k = 0; k < K; ++k) {
      float v = ss[k];
      if (a.renormalize && sum > 0.0f) v = v / sum;
      ids[k] = si[k];
      w[k] = a.scale != 1.0f ? v * a.scale : v;
    }
  }
}

}  // namespace

void route_device(const RoutingConfig& rc, const void* d_logits, DType logits_dtype, int T, int E, int K,
                  const float* d_correction_bias, int32_t* d_topk_ids, float* d_topk_weights, void* stream) {
  validate_routing(rc, T, E, K, d_correction_bias != nullptr);
  if (E > kMaxRouteExperts)
    throw Error("route_device: E = " + std::to_string(E) + " exceeds the device routing limit of " +
                std::to_string(kMaxRouteExperts) + " experts");
  if (rc.n_group > kMaxRouteGroups)
    throw Error("route_device: n_group = " + std::to_string(rc.n_group) + " exceeds " + std::to_string(kMaxRouteGroups));
  if (K > kMaxRouteGroups)
    throw Error("route_device: top_k = " + std::to_string(K) + " exceeds " + std::to_string(kMaxRouteGroups));
  if (T == 0) return;
  if (!d_logits || !d_topk_ids || !d_topk_weights) throw Error("route_device: null device pointer");
  RouteArgs a;
  a.logits = d_logits;
  switch (logits_dtype) {
    case DType::F32: a.lt = XType::F32; break;
    case DType::BF16: a.lt = XType::BF16; break;
    case DType::F16: a.lt = XType::F16; break;
    default: throw Error("route_device: router logits must be F32, BF16 or F16, got " + std::string(dtype_name(logits_dtype)));
  }
  a.bias = d_correction_bias;
  a.E = E;
  a.K = K;
  a.scoring_sigmoid = rc.scoring == ScoringFunc::Sigmoid;
  a.renormalize = rc.renormalize;
  a.topk_then_softmax = rc.topk_then_softmax;
  a.n_group = rc.n_group;
  a.topk_group = rc.topk_group;
  a.scale = rc.routed_scaling_factor;
  a.ids = d_topk_ids;
  a.weights = d_topk_weights;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  // Warp per token where the experts fit a warp's registers and the groups its lanes.
  if (E <= 1024 && (rc.n_group <= 32)) {
    const int grid = (T + kWarpTokens - 1) / kWarpTokens;
    const int V = (E + 31) / 32;
    if (V <= 1) launch_pdl(route_warp_kernel<1>, grid, 32 * kWarpTokens, 0, st, a, T);
    else if (V <= 4) launch_pdl(route_warp_kernel<4>, grid, 32 * kWarpTokens, 0, st, a, T);
    else if (V <= 8) launch_pdl(route_warp_kernel<8>, grid, 32 * kWarpTokens, 0, st, a, T);
    else launch_pdl(route_warp_kernel<32>, grid, 32 * kWarpTokens, 0, st, a, T);
    return;
  }
  const size_t smem = sizeof(float) * 2 * static_cast<size_t>(E);
  static const bool configured = [] {
    QMOE_CUDA_CHECK(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(sizeof(float) * 2 * kMaxRouteExperts)));
    return true;
  }();
  (void)configured;
  launch_pdl(route_kernel, T, kRouteThreads, smem, st, a);
}

}  // namespace qmoe::cuda
