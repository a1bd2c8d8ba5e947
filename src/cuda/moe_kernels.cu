// The small kernels around the GEMMs: align (slot lists + tiles), activation quantization of the
// layer input, activation + intermediate quantization, combine, and the random fill used by the
// benchmarks.
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/combine.cuh"
#include "cuda/cuda_common.h"
#include "cuda/frag_layout.h"
#include "cuda/launch.cuh"
#include "cuda/row_quant.cuh"

namespace qmoe::cuda {

// ---- align ---------------------------------------------------------------------------------
constexpr int kAlignThreads = 1024;
constexpr int kAlignItems = kMaxLocalExperts / kAlignThreads;
constexpr int kAlignIlp = 8;

// align's totals (by one thread): the slot count after the last expert's offset, the tile count,
// and the persistent GEMMs' two work counters reset (GemmArgs::claim).
__device__ __forceinline__ void align_totals(const AlignArgs& a, int total_slots, int total_tiles) {
  a.offsets[a.E_loc] = total_slots;
  a.num_tiles[0] = total_tiles;
  a.num_tiles[1] = 0;
  a.num_tiles[2] = 0;
}

// Few slots (T · K ≤ kWarpAlignSlots: decode): warp 0 ranks the slots against each other (a slot's
// position is the number of slots of lower local experts plus the earlier slots of its own) and
// lays out the tiles (an expert's first slot writes them, after the tiles of lower experts); then
// the block writes every local expert's count and offset from the 32 ranked slots. One barrier and
// no block-wide scan over the kMaxLocalExperts counters, where the general path below takes five.
// The outputs are the general path's, except that within an expert the slots are in slot order
// (there, in atomicAdd order).
__device__ __forceinline__ void align_warp(const AlignArgs& a) {
  __shared__ int s_le[kWarpAlignSlots];
  const int tid = threadIdx.x;
  if (tid < kWarpAlignSlots) {
    const int j = tid;
    int le = -1;
    if (j < a.TK) {
      const int id = a.topk_ids[j];
      le = id >= 0 && id < a.E ? a.expert_map[id] : -1;
      a.slot_local[j] = le;
    }
    int count = 0, lower = 0, earlier = 0;  // slots of this expert, of lower experts, of this expert before j
#pragma unroll 8
    for (int k = 0; k < kWarpAlignSlots; ++k) {
      const int lk = __shfl_sync(0xFFFFFFFFu, le, k);
      count += lk == le;
      lower += lk >= 0 && lk < le;
      earlier += k < j && lk == le;
    }
    const int tiles = le >= 0 && earlier == 0 ? (count + a.bt - 1) / a.bt : 0;
    int toff = 0, total_tiles = 0, total_slots = 0;
#pragma unroll 8
    for (int k = 0; k < kWarpAlignSlots; ++k) {
      const int lk = __shfl_sync(0xFFFFFFFFu, le, k), tk = __shfl_sync(0xFFFFFFFFu, tiles, k);
      toff += lk >= 0 && lk < le ? tk : 0;
      total_tiles += tk;
      total_slots += lk >= 0;
    }
    if (le >= 0) {
      const int p = lower + earlier;
      a.sorted_slots[p] = j;
      a.slot_pos[j] = p;
      for (int q = 0; q < tiles; ++q) {
        a.tile_expert[toff + q] = le;
        a.tile_m0[toff + q] = q * a.bt;
      }
    }
    s_le[j] = le;
    if (j == 0) align_totals(a, total_slots, total_tiles);
  }
  __syncthreads();
  for (int e = tid; e < a.E_loc; e += kAlignThreads) {
    int count = 0, off = 0;
#pragma unroll 8
    for (int k = 0; k < kWarpAlignSlots; ++k) {
      const int lk = s_le[k];
      count += lk == e;
      off += lk >= 0 && lk < e;
    }
    a.counts[e] = count;
    a.offsets[e] = off;
  }
}

__device__ __forceinline__ void align_block(const AlignArgs& a) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  if (a.debug_delay_ns > 0) {  // tests only (AlignArgs::debug_delay_ns)
    if (threadIdx.x == 0) {
      uint64_t t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      } while (t - t0 < static_cast<uint64_t>(a.debug_delay_ns));
    }
    __syncthreads();
  }
  if (a.warp_rank) return align_warp(a);
  __shared__ int s_cnt[kMaxLocalExperts + 1];  // counts, then tile offsets
  __shared__ int s_pos[kMaxLocalExperts];
  int* s_toff = s_cnt;
  using Scan = cub::BlockScan<int, kAlignThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int tid = threadIdx.x;
  for (int e = tid; e < a.E_loc; e += kAlignThreads) s_cnt[e] = 0;
  __syncthreads();
  // kAlignIlp slots per thread per round, each round's loads in flight together (a single block
  // walks all T · K slots: one load at a time made it latency-bound at prefill).
  for (int i0 = tid; i0 < a.TK; i0 += kAlignIlp * kAlignThreads) {
    int id[kAlignIlp], le[kAlignIlp];
#pragma unroll
    for (int q = 0; q < kAlignIlp; ++q) id[q] = ld_issue(a.topk_ids + i0 + q * kAlignThreads, i0 + q * kAlignThreads < a.TK, -1);
#pragma unroll
    for (int q = 0; q < kAlignIlp; ++q) le[q] = ld_issue(a.expert_map + id[q], id[q] >= 0 && id[q] < a.E, -1);
#pragma unroll
    for (int q = 0; q < kAlignIlp; ++q) {
      const int i = i0 + q * kAlignThreads;
      if (i >= a.TK) break;
      a.slot_local[i] = le[q];
      if (le[q] >= 0) atomicAdd(&s_cnt[le[q]], 1);
    }
  }
  __syncthreads();
  int c[kAlignItems], t[kAlignItems], off[kAlignItems], toff[kAlignItems];
#pragma unroll
  for (int j = 0; j < kAlignItems; ++j) {
    const int e = tid * kAlignItems + j;
    c[j] = e < a.E_loc ? s_cnt[e] : 0;
    t[j] = (c[j] + a.bt - 1) / a.bt;
  }
  int total_slots = 0, total_tiles = 0;
  __syncthreads();  // every count is in registers before s_cnt becomes s_toff
  Scan(tmp).ExclusiveSum(c, off, total_slots);
  __syncthreads();
  Scan(tmp).ExclusiveSum(t, toff, total_tiles);
#pragma unroll
  for (int j = 0; j < kAlignItems; ++j) {
    const int e = tid * kAlignItems + j;
    if (e < a.E_loc) {
      a.counts[e] = c[j];
      a.offsets[e] = off[j];
      s_pos[e] = off[j];
      s_toff[e] = toff[j];
    }
  }
  if (tid == 0) {
    align_totals(a, total_slots, total_tiles);
    s_toff[a.E_loc] = total_tiles;
  }
  __syncthreads();
  // Tiles: tile ti belongs to the expert e with toff[e] ≤ ti < toff[e+1] (binary search).
  for (int ti = tid; ti < total_tiles; ti += kAlignThreads) {
    int lo = 0, hi = a.E_loc;  // invariant: s_toff[lo] ≤ ti < s_toff[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (s_toff[mid] <= ti) lo = mid; else hi = mid;
    }
    a.tile_expert[ti] = lo;
    a.tile_m0[ti] = (ti - s_toff[lo]) * a.bt;
  }
  for (int i0 = tid; i0 < a.TK; i0 += kAlignIlp * kAlignThreads) {
    int le[kAlignIlp];
#pragma unroll
    for (int q = 0; q < kAlignIlp; ++q)  // written by this thread above
      le[q] = ld_issue(a.slot_local + i0 + q * kAlignThreads, i0 + q * kAlignThreads < a.TK, -1);
#pragma unroll
    for (int q = 0; q < kAlignIlp; ++q)
      if (le[q] >= 0) {
        const int p = atomicAdd(&s_pos[le[q]], 1);
        a.sorted_slots[p] = i0 + q * kAlignThreads;
        a.slot_pos[i0 + q * kAlignThreads] = p;
      }
  }
}

__global__ void __launch_bounds__(kAlignThreads) align_kernel(const AlignArgs a) { align_block(a); }

namespace {
std::atomic<int> g_align_delay_ns{0};
}  // namespace
void set_align_debug_delay_ns(int ns) { g_align_delay_ns = ns; }
int align_debug_delay_ns() { return g_align_delay_ns.load(std::memory_order_relaxed); }

void launch_align(const AlignArgs& a, cudaStream_t s) {
  launch_pdl(align_kernel, 1, kAlignThreads, 0, s, a);
  QMOE_CUDA_CHECK(cudaGetLastError());
}

// ---- the GEMM operand rows in tile order (GemmArgs::a_tma) ---------------------------------------
constexpr int kGatherThreads = 256;

// One block per destination row p (grid: the bound max_rows; rows at or past *total are skipped).
__global__ void __launch_bounds__(kGatherThreads)
    gather_rows_kernel(const uint4* __restrict__ src_hi, const uint4* __restrict__ src_lo, int64_t row_words,
                       const int32_t* __restrict__ sorted_slots, int row_div, const int32_t* __restrict__ total,
                       uint4* __restrict__ dst_hi, uint4* __restrict__ dst_lo) {
  pdl_wait();
  pdl_trigger();
  const int p = blockIdx.x;
  if (p >= __ldcg(total)) return;
  const int64_t from = static_cast<int64_t>(__ldcg(sorted_slots + p) / row_div) * row_words;
  const int64_t to = static_cast<int64_t>(p) * row_words;
  for (int64_t i = threadIdx.x; i < row_words; i += kGatherThreads) {
    dst_hi[to + i] = src_hi[from + i];
    if (dst_lo) dst_lo[to + i] = src_lo[from + i];
  }
}

void launch_gather_rows(const void* src_hi, const void* src_lo, int64_t row_bytes, const int32_t* sorted_slots,
                        int row_div, const int32_t* total, int max_rows, void* dst_hi, void* dst_lo, cudaStream_t s) {
  if (max_rows <= 0) return;
  launch_pdl(gather_rows_kernel, max_rows, kGatherThreads, 0, s, static_cast<const uint4*>(src_hi),
             static_cast<const uint4*>(src_lo), row_bytes / 16, sorted_slots, row_div, total, static_cast<uint4*>(dst_hi),
             static_cast<uint4*>(dst_lo));
  QMOE_CUDA_CHECK(cudaGetLastError());
}

// ---- input quantization ----------------------------------------------------------------------
template <XType X>
__device__ __forceinline__ float load_x(const void* x, int64_t i) {
  if constexpr (X == XType::BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
  else if constexpr (X == XType::F16) return __half2float(static_cast<const __half*>(x)[i]);
  else return static_cast<const float*>(x)[i];
}

// One block per token row; a row holding a non-finite value counts as zeros (quant_input_kernel
// quantizes it as zeros and combine makes its output NaN).
template <XType X>
__global__ void absmax_kernel(const void* x, int T, int H, const float* w, int K, bool on_input, unsigned* amax) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  const float f = on_input ? w[static_cast<int64_t>(t) * K] : 1.0f;
  float m = 0.0f;
  int nonfinite = 0;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float v = load_x<X>(x, static_cast<int64_t>(t) * H + h);
    if (on_input) v *= f;
    nonfinite |= !isfinite(v);
    m = fmaxf(m, fabsf(v));
  }
  if (__syncthreads_or(nonfinite)) return;
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

void launch_absmax_input(const void* x, XType xt, int T, int H, const float* topk_w, int K, bool on_input,
                         unsigned* amax_bits, cudaStream_t s) {
  switch (xt) {
    case XType::F32: launch_pdl(absmax_kernel<XType::F32>, T, 256, 0, s, x, T, H, topk_w, K, on_input, amax_bits); break;
    case XType::BF16: launch_pdl(absmax_kernel<XType::BF16>, T, 256, 0, s, x, T, H, topk_w, K, on_input, amax_bits); break;
    case XType::F16: launch_pdl(absmax_kernel<XType::F16>, T, 256, 0, s, x, T, H, topk_w, K, on_input, amax_bits); break;
  }
}

// A token row holding a non-finite value (after the routing weight, when applied on the input) is
// quantized as zeros, so that nothing non-finite reaches the GEMMs or the tensor-wide scales, and
// flagged in bad[t]: combine_kernel writes its output row as NaN (docs/DECISIONS.md).
// after_align: the kernel just before is align_kernel, which waited for everything before it and
// only then let this grid start (launch.cuh), and nothing here reads what align writes: the rows
// are quantized beside align (one block, ~40 µs at 32768 slots) instead of after it, and block 0
// alone waits for align's completion, at its end, so that this grid's completion still implies
// align's. It triggers its dependants before that, so the GEMM after it must read the tile lists
// after its own wait (GemmArgs::tiles_after_wait, set by experts.cc). Every block waiting at its
// end held its slot and kept the later rows from starting (measured 1.006x at qwen3-30b-a3b
// T = 4096, H100).
template <XType X>
__device__ __forceinline__ void quant_input_row(int t, const void* x, int H, const float* w, int K, bool on_input,
                                                const RowQuant& q, const RowOut& o, int32_t* bad, bool after_align) {
  if (!after_align) pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ float sv[];
  __shared__ float red[32];
  const float f = on_input ? w[static_cast<int64_t>(t) * K] : 1.0f;
  int nonfinite = 0;
#pragma unroll 4
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    const float v = load_x<X>(x, static_cast<int64_t>(t) * H + h);
    const float u = on_input ? v * f : v;
    nonfinite |= !isfinite(u);
    sv[h] = u;
  }
  const int any = __syncthreads_or(nonfinite);
  if (any) {
    for (int h = threadIdx.x; h < H; h += blockDim.x) sv[h] = 0.0f;
    __syncthreads();
  }
  if (threadIdx.x == 0) bad[t] = any ? 1 : 0;
  quantize_row(sv, H, q, o, t, red);
  if (after_align && t == 0) pdl_wait();
}

template <XType X>
__global__ void __launch_bounds__(kRowThreads) quant_input_kernel(const void* x, int H, const float* w, int K,
                                                                  bool on_input, const RowQuant q, const RowOut o,
                                                                  int32_t* bad, bool after_align) {
  quant_input_row<X>(blockIdx.x, x, H, w, K, on_input, q, o, bad, after_align);
}

// align and the input quantization in one launch (decode: one kernel boundary fewer on the
// layer's critical path): blocks 0..T−1 quantize token rows, block T aligns. Its outputs are
// complete only when the whole grid is, so the GEMM after it reads the tile lists after its
// pdl_wait (GemmArgs::tiles_after_wait).
template <XType X>
__global__ void __launch_bounds__(kAlignThreads) prep_kernel(const AlignArgs al, const void* x, int H, const float* w,
                                                             int K, bool on_input, const RowQuant q, const RowOut o,
                                                             int32_t* bad) {
  if (blockIdx.x == gridDim.x - 1) align_block(al);
  else quant_input_row<X>(blockIdx.x, x, H, w, K, on_input, q, o, bad, false);
}

// Rows from which the one-row-per-block kernels and combine take their prefill configuration:
// 512-thread blocks fill the GPU from ~4 per SM. Below it (decode) they keep the latency-first
// one (H200, bench/RESULTS.md 2026-12-03: the prefill configuration made qwen3-30b-a3b T = 1 / 16
// 4–13 % slower and T = 4096 17–24 % faster).
constexpr int kPrefillRows = 512;

// Threads of a one-row-per-block kernel over n values in `rows` blocks: kRowThreads for a few rows;
// for many, ~8 values per thread (one round of act_kernel's loads; a multiple of the warp, 64 to
// kRowThreads), so that short rows (qwen3's I = 768) do not leave most of a block idle.
static int row_threads(int n, int rows) {
  if (rows < kPrefillRows) return kRowThreads;
  const int t = ((n + 7) / 8 + 31) / 32 * 32;
  return std::min(kRowThreads, std::max(64, t));
}

// Raise a kernel's dynamic shared-memory limit only when needed (its static shared memory plus
// `bytes` past the 48 KB default) and only once per size, so that launches inside a CUDA-graph
// capture make no attribute calls after the warm-up.
static void set_smem(const void* fn, size_t bytes, std::atomic<size_t>& configured, size_t static_bytes = 0) {
  if (static_bytes + bytes <= 48 * 1024 || bytes <= configured.load()) return;
  QMOE_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  configured = bytes;
}

template <XType X>
void launch_quant_input_t(const void* x, int T, int H, const float* topk_w, int K, bool on_input, const RowQuant& q,
                          const RowOut& out, int32_t* bad, bool after_align, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(H) * sizeof(float);
  static std::atomic<size_t> cfg{0};
  set_smem(reinterpret_cast<const void*>(quant_input_kernel<X>), smem, cfg);
  launch_pdl(quant_input_kernel<X>, T, row_threads(H, T), smem, s, x, H, topk_w, K, on_input, q, out, bad, after_align);
}

template <XType X>
void launch_prep_t(const AlignArgs& al, const void* x, int T, int H, const float* topk_w, int K, bool on_input,
                   const RowQuant& q, const RowOut& out, int32_t* bad, int smem_optin, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(H) * sizeof(float);
  // align's static shared memory (~41 KB: kMaxLocalExperts counters, the scan) and the row's
  // dynamic part together pass the 48 KB default from H ≈ 1800: opt in for the dynamic part
  // whenever the sum does (mixtral's H = 4096 failed to launch without it).
  static const size_t static_bytes = [] {
    cudaFuncAttributes fa{};
    QMOE_CUDA_CHECK(cudaFuncGetAttributes(&fa, prep_kernel<X>));
    return fa.sharedSizeBytes;
  }();
  // A row too wide to share a block with align: two launches.
  if (static_bytes + smem > static_cast<size_t>(smem_optin)) {
    launch_align(al, s);
    launch_quant_input_t<X>(x, T, H, topk_w, K, on_input, q, out, bad, true, s);
    return;
  }
  static std::atomic<size_t> cfg{0};
  set_smem(reinterpret_cast<const void*>(prep_kernel<X>), smem, cfg, static_bytes);
  launch_pdl(prep_kernel<X>, T + 1, kAlignThreads, smem, s, al, x, H, topk_w, K, on_input, q, out, bad);
}

bool fused_prep_enabled() {
  static const bool on = env_switch("QMOE_CUDA_FUSE_PREP");
  return on;
}

bool warp_align_enabled() {
  static const bool on = env_switch("QMOE_CUDA_WARP_ALIGN");
  return on;
}

bool fit_n_enabled() {
  static const bool on = env_switch("QMOE_CUDA_FITN");
  return on;
}

void launch_prep(const AlignArgs& al, const void* x, XType xt, int T, int H, const float* topk_w, int K,
                 bool on_input, const RowQuant& q, const RowOut& out, int32_t* bad, int smem_optin, cudaStream_t s) {
  switch (xt) {
    case XType::F32: launch_prep_t<XType::F32>(al, x, T, H, topk_w, K, on_input, q, out, bad, smem_optin, s); break;
    case XType::BF16: launch_prep_t<XType::BF16>(al, x, T, H, topk_w, K, on_input, q, out, bad, smem_optin, s); break;
    case XType::F16: launch_prep_t<XType::F16>(al, x, T, H, topk_w, K, on_input, q, out, bad, smem_optin, s); break;
  }
}

void launch_quant_input(const void* x, XType xt, int T, int H, const float* topk_w, int K, bool on_input,
                        const RowQuant& q, const RowOut& out, int32_t* bad, bool after_align, cudaStream_t s) {
  switch (xt) {
    case XType::F32: launch_quant_input_t<XType::F32>(x, T, H, topk_w, K, on_input, q, out, bad, after_align, s); break;
    case XType::BF16: launch_quant_input_t<XType::BF16>(x, T, H, topk_w, K, on_input, q, out, bad, after_align, s); break;
    case XType::F16: launch_quant_input_t<XType::F16>(x, T, H, topk_w, K, on_input, q, out, bad, after_align, s); break;
  }
}

// ---- activation ------------------------------------------------------------------------------
__device__ __forceinline__ float act_fn(const ActParams& p, float g, float u) {
  switch (p.kind) {
    case Activation::Silu:
      if (p.has_limit) {
        g = fminf(g, p.limit);
        u = fminf(fmaxf(u, -p.limit), p.limit);
      }
      return g / (1.0f + expf(-g)) * u;
    case Activation::Gelu:
      return 0.5f * g * (1.0f + erff(g / 1.41421356237309515f)) * u;
    case Activation::GeluTanh: {
      const float inner = 0.797884560802865355f * (g + 0.044715f * g * g * g);
      return 0.5f * g * (1.0f + tanhf(inner)) * u;
    }
    case Activation::SwigluOai: {
      const float L = p.has_limit ? p.limit : 7.0f;
      g = fminf(g, L);
      u = fminf(fmaxf(u, -L), L);
      return (u + 1.0f) * g * (1.0f / (1.0f + expf(-p.alpha * g)));
    }
  }
  return 0.0f;
}

constexpr int kActIlp = 8;  // act_kernel: elements per thread whose loads are in flight together

// Block (slot, c) computes columns [c · cw, c · cw + n) of the slot's intermediate row (cw a
// multiple of 32; gridDim.y = 1 and cw = I for the per-token dynamic modes, whose scale needs the
// whole row).
__global__ void __launch_bounds__(kRowThreads) act_kernel(const float* y1p, int ksplit, int TK, int I, int cw,
                                                          const int32_t* slot_local, const float* b13,
                                                          const ActParams p, const RowQuant q, const RowOut o,
                                                          bool defer, float* zbuf, unsigned* amax_bits) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ float sz[];
  __shared__ float red[32];
  const int slot = blockIdx.x;
  const int le = slot_local[slot];
  if (le < 0) return;
  const int c0 = static_cast<int>(blockIdx.y) * cw;
  const int n = min(cw, I - c0);
  const int N = 2 * I;
  const int64_t split_stride = static_cast<int64_t>(TK) * N;
  const float* y = y1p + static_cast<int64_t>(slot) * N;
  const float* b = b13 ? b13 + static_cast<int64_t>(le) * N : nullptr;
  // kActIlp elements per thread per round, their loads issued together (one row is one block: at
  // decode a handful of blocks stream whole rows, and one load per round trip left them
  // latency-bound). The sums keep the split order of the reference.
  const int nthr = blockDim.x;
  // j: column within the chunk; the row's column is c0 + j.
  auto gate_at = [&](int j) { return p.interleaved ? 2 * (c0 + j) : c0 + j; };
  auto up_at = [&](int j) { return p.interleaved ? 2 * (c0 + j) + 1 : I + c0 + j; };
  for (int j0 = threadIdx.x; j0 < n; j0 += kActIlp * nthr) {
    float g[kActIlp], u[kActIlp], gv[kActIlp], uv[kActIlp];
#pragma unroll
    for (int q = 0; q < kActIlp; ++q) g[q] = u[q] = 0.0f;
    for (int s = 0; s < ksplit; ++s) {
      const float* ys = y + s * split_stride;
#pragma unroll
      for (int q = 0; q < kActIlp; ++q) {  // all loads first (ld_issue), then the sums
        const int j = j0 + q * nthr;
        gv[q] = ld_issue(ys + gate_at(j), j < n, 0.0f);
        uv[q] = ld_issue(ys + up_at(j), j < n, 0.0f);
      }
#pragma unroll
      for (int q = 0; q < kActIlp; ++q) {
        if (j0 + q * nthr < n) {
          g[q] += gv[q];
          u[q] += uv[q];
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kActIlp; ++q) {
      const int j = j0 + q * nthr;
      if (j >= n) break;
      if (b) {
        g[q] += b[gate_at(j)];
        u[q] += b[up_at(j)];
      }
      sz[j] = act_fn(p, g[q], u[q]);
    }
  }
  __syncthreads();
  if (defer) {
    for (int j = threadIdx.x; j < n; j += blockDim.x) zbuf[static_cast<int64_t>(slot) * I + c0 + j] = sz[j];
    const float m = block_absmax(sz, n, red);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
  } else {
    quantize_row(sz, n, q, o, slot, red, c0);
  }
}

// ---- activation, vector form ---------------------------------------------------------------
// For the modes whose quantization needs no statistic of the whole row (none, MX, NVFP4, static
// FP8 / INT8; act_vec_mode): one thread per V consecutive intermediate features, kIlp such groups
// per thread with their loads in flight together, kSplits split partials at a time; an MX (32) /
// NVFP4 (16) block's maximum comes from the 32 / V (16 / V) lanes that hold it (shuffles). No
// shared-memory row and no block barrier. Prefill takes V = 4 (16-byte partial and bias loads,
// 8-byte stores, blocks sized to the row; 4 groups per thread once there are kActVecWaves waves of
// them: act_kernel ran there at ~40 % of the bandwidth its bytes need, bench/RESULTS.md
// 2026-12-03); decode V = 1 (one feature per thread, 4 split partials at a time: a short chain per
// thread while a few rows fill few SMs).
// Same arithmetic as act_kernel + quantize_row (partials summed in split order, bias, act_fn, the
// formats.h / qdq_fast.h quantizers): the same outputs bit for bit.
constexpr int kActVecThreads = 256;
constexpr int kActVecWaves = 8;  // waves of 2048 threads per SM from which a thread takes 4 groups

// Stores V consecutive outputs (one 8 / 4-byte store for V = 4).
template <int V, class T>
__device__ __forceinline__ void st_v(T* p, const T (&v)[V]) {
  if constexpr (V == 1) {
    *p = v[0];
  } else {
    static_assert(V == 4 && (sizeof(T) == 2 || sizeof(T) == 1), "4 16- or 8-bit outputs");
    using W = typename std::conditional<sizeof(T) == 2, uint2, uint32_t>::type;
    W w;
    memcpy(&w, v, sizeof(W));
    *reinterpret_cast<W*>(p) = w;
  }
}

template <int V>
__device__ __forceinline__ float absmax_v(const float (&z)[V]) {
  float m = fabsf(z[0]);
#pragma unroll
  for (int c = 1; c < V; ++c) m = fmaxf(m, fabsf(z[c]));
  return m;
}

template <class F, int V>
__device__ __forceinline__ void mx_qdq_v(const float (&z)[V], bool on, MxScaleMode mode, __nv_bfloat16* hi) {
  const int sh = mx_shared_exponent(lanes_max(absmax_v(z), kMxBlock / V), F::kElem, mode);
  __nv_bfloat16 h[V];
#pragma unroll
  for (int c = 0; c < V; ++c) h[c] = __float2bfloat16_rn(mx_qdq<F>(z[c], sh));
  if (on) st_v<V>(hi, h);
}

template <int V, int kIlp, int kSplits>
__global__ void __launch_bounds__(kActVecThreads) act_vec_kernel(const float* y1p, int ksplit, int TK, int I,
                                                                  const int32_t* slot_local, const float* b13,
                                                                  const ActParams p, const RowQuant q,
                                                                  const RowOut o) {
  static_assert(V == 1 || V == 4, "1 or 4 features per thread");
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int slot = blockIdx.x;
  const int le = slot_local[slot];
  if (le < 0) return;  // uniform over the block: the shuffles below see whole warps
  const int N = 2 * I;
  const int64_t split_stride = static_cast<int64_t>(TK) * N;
  const float* y = y1p + static_cast<int64_t>(slot) * N;
  const float* b = b13 ? b13 + static_cast<int64_t>(le) * N : nullptr;
  const int nt = static_cast<int>(blockDim.x);  // a multiple of 32
  const int fb = (static_cast<int>(blockIdx.y) * kIlp * nt + static_cast<int>(threadIdx.x)) * V;
  auto feat = [&](int r) { return fb + r * nt * V; };
  // Gate and up of features f..f+V−1 from row r (a split partial or the bias), [g0 g1 g2 g3] and
  // [u0 u1 u2 u3] or interleaved [g0 u0 g1 u1] [g2 u2 g3 u3]: loads at addresses chosen by select,
  // unconditional (an out-of-range group reads the row's start and takes zeros), so that a run of
  // them has no branch and no order the compiler must keep (act_kernel's predicated volatile loads
  // came out interleaved with the adds of the group before here).
  const bool il = p.interleaved;
  auto load_gu = [&](const float* r, int f, bool on, float (&g)[V], float (&u)[V]) {
    if constexpr (V == 4) {
      const float4 a = *reinterpret_cast<const float4*>(r + (on ? (il ? 2 * f : f) : 0));
      const float4 c = *reinterpret_cast<const float4*>(r + (on ? (il ? 2 * f + 4 : I + f) : 0));
      g[0] = on ? a.x : 0.0f, u[0] = on ? (il ? a.y : c.x) : 0.0f;
      g[1] = on ? (il ? a.z : a.y) : 0.0f, u[1] = on ? (il ? a.w : c.y) : 0.0f;
      g[2] = on ? (il ? c.x : a.z) : 0.0f, u[2] = on ? (il ? c.y : c.z) : 0.0f;
      g[3] = on ? (il ? c.z : a.w) : 0.0f, u[3] = on ? (il ? c.w : c.w) : 0.0f;
    } else {
      const float a = r[on ? (il ? 2 * f : f) : 0];
      const float c = r[on ? (il ? 2 * f + 1 : I + f) : 0];
      g[0] = on ? a : 0.0f, u[0] = on ? c : 0.0f;
    }
  };
  float g[kIlp][V], u[kIlp][V];
#pragma unroll
  for (int r = 0; r < kIlp; ++r)
#pragma unroll
    for (int c = 0; c < V; ++c) g[r][c] = u[r][c] = 0.0f;
  for (int s0 = 0; s0 < ksplit; s0 += kSplits) {
    float gv[kSplits][kIlp][V], uv[kSplits][kIlp][V];
#pragma unroll
    for (int k = 0; k < kSplits; ++k)
#pragma unroll
      for (int r = 0; r < kIlp; ++r)
        load_gu(y + min(s0 + k, ksplit - 1) * split_stride, feat(r), feat(r) < I && s0 + k < ksplit, gv[k][r],
                uv[k][r]);  // a split past ksplit reads the last one's row (in bounds) and takes zeros
    // Sums in split order; a split past ksplit adds the +0.0 its load took, which changes no sum
    // (the sums start at +0.0 and are never −0.0), and no branch lets the compiler sink the loads.
#pragma unroll
    for (int k = 0; k < kSplits; ++k) {
#pragma unroll
      for (int r = 0; r < kIlp; ++r)
#pragma unroll
        for (int c = 0; c < V; ++c) {
          g[r][c] += gv[k][r][c];
          u[r][c] += uv[k][r][c];
        }
    }
  }
  const int64_t orow = o.value_row(slot) * o.stride;
#pragma unroll
  for (int r = 0; r < kIlp; ++r) {
    const int f = feat(r);
    const bool on = f < I;  // V = 4 needs I % 4 == 0: a group is wholly in or out
    float z[V];
#pragma unroll
    for (int c = 0; c < V; ++c) z[c] = 0.0f;
    if (on) {
      if (b) {
        float bg[V], bu[V];
        load_gu(b, f, true, bg, bu);
#pragma unroll
        for (int c = 0; c < V; ++c) {
          g[r][c] += bg[c];
          u[r][c] += bu[c];
        }
      }
#pragma unroll
      for (int c = 0; c < V; ++c) z[c] = act_fn(p, g[r][c], u[r][c]);
    }
    __nv_bfloat16* hi = static_cast<__nv_bfloat16*>(o.a_hi) + orow + f;
    switch (q.mode) {
      case ActQuant::None:
        if (on) {
          __nv_bfloat16 h[V];
#pragma unroll
          for (int c = 0; c < V; ++c) h[c] = __float2bfloat16_rn(z[c]);
          st_v<V>(hi, h);
          if (q.split) {
            __nv_bfloat16 l[V];
#pragma unroll
            for (int c = 0; c < V; ++c) l[c] = __float2bfloat16_rn(z[c] - __bfloat162float(h[c]));
            st_v<V>(static_cast<__nv_bfloat16*>(o.a_lo) + orow + f, l);
          }
        }
        break;
      case ActQuant::Mxfp4: mx_qdq_v<QdqFp4E2M1>(z, on, q.mx_mode, hi); break;
      case ActQuant::Mxfp6E2M3: mx_qdq_v<QdqFp6E2M3>(z, on, q.mx_mode, hi); break;
      case ActQuant::Mxfp6E3M2: mx_qdq_v<QdqFp6E3M2>(z, on, q.mx_mode, hi); break;
      case ActQuant::Nvfp4: {
        const Nvfp4Block blk(lanes_max(absmax_v(z), kNvfp4Block / V), q.static_scale);
        __nv_bfloat16 h[V];
#pragma unroll
        for (int c = 0; c < V; ++c) h[c] = __float2bfloat16_rn(blk.qdq(z[c]));
        if (on) st_v<V>(hi, h);
        break;
      }
      case ActQuant::Fp8Static: {
        const float inv = 1.0f / q.static_scale;
        if (!on) break;
        if (q.e4m3) {
          uint8_t* c8 = static_cast<uint8_t*>(o.a_hi) + orow;
          if constexpr (V == 4) {
            // Features f, f + 1 (f % 4 == 0) land at e4m3_act_pos(f) and the next byte, f + 2, f + 3
            // four bytes on: two 2-byte stores.
            const int p0 = e4m3_act_pos(f);
            *reinterpret_cast<uint16_t*>(c8 + p0) = e4m3x2_act_codes(z[0], z[1], inv);
            *reinterpret_cast<uint16_t*>(c8 + p0 + 4) = e4m3x2_act_codes(z[2], z[3], inv);
          } else {
            c8[e4m3_act_pos(f)] = e4m3_act_code(z[0], inv);
          }
        } else if (q.f16) {
          __half h[V];
#pragma unroll
          for (int c = 0; c < V; ++c) h[c] = __float2half_rn(qdq_fp8_act(z[c], inv));
          st_v<V>(static_cast<__half*>(o.a_hi) + orow + f, h);
        } else {
          __nv_bfloat16 h[V];
#pragma unroll
          for (int c = 0; c < V; ++c) h[c] = __float2bfloat16_rn(qdq_fp8_act(z[c], inv));
          st_v<V>(hi, h);
        }
        break;
      }
      case ActQuant::Int8Static: {
        if (!on) break;
        int8_t i8[V];
#pragma unroll
        for (int c = 0; c < V; ++c) i8[c] = int8_quantize_static(z[c], q.static_scale);
        st_v<V>(static_cast<int8_t*>(o.a_hi) + orow + f, i8);
        break;
      }
      default: break;  // not taken: act_vec_mode
    }
  }
}

static bool act_vec_enabled() {
  static const bool on = env_switch("QMOE_CUDA_ACT_VEC");
  return on;
}

// The vector kernel's modes (quantization local to an element or an MX / NVFP4 block), and for
// V = 4 whole 4-feature groups with 16-byte aligned partial / bias rows and 4-element aligned outputs.
static bool act_vec_mode(const RowQuant& q, bool defer) {
  return act_vec_enabled() && !defer &&
         (q.mode == ActQuant::None || q.mode == ActQuant::Mxfp4 || q.mode == ActQuant::Mxfp6E2M3 ||
          q.mode == ActQuant::Mxfp6E3M2 || q.mode == ActQuant::Nvfp4 || q.mode == ActQuant::Fp8Static ||
          q.mode == ActQuant::Int8Static);
}
static bool act_vec4_fits(int I, const float* y1p, const float* b13, const RowQuant& q, const RowOut& o) {
  auto al = [](const void* ptr, unsigned n) { return reinterpret_cast<uintptr_t>(ptr) % n == 0; };
  const unsigned ob = q.mode == ActQuant::Int8Static ? 4 : 8;  // bytes of 4 outputs
  return I % 4 == 0 && o.stride % 4 == 0 && al(y1p, 16) && (b13 == nullptr || al(b13, 16)) && al(o.a_hi, ob) &&
         (o.a_lo == nullptr || al(o.a_lo, ob));
}

static bool act_split_enabled() {
  static const bool on = env_switch("QMOE_CUDA_ACT_SPLIT");
  return on;
}

// Columns per act_kernel block: the whole row at prefill (one row per block fills the GPU) and for
// the per-token dynamic modes; at decode a few rows would leave most SMs idle while each block
// streams a long row (mixtral's I = 14336: 20 µs for 32 rows, bench/RESULTS.md 2026-12-03), so
// rows split into chunks of ≥ kActMinChunk columns until ~kActBlocksPerSm blocks per SM run.
constexpr int kActBlocksPerSm = 2;
constexpr int kActMinChunk = 1024;
static int act_chunk(int I, int TK, ActQuant mode, int num_sms) {
  if (TK >= kPrefillRows || mode == ActQuant::Fp8DynToken || mode == ActQuant::Int8DynToken || !act_split_enabled())
    return I;
  const int blocks = kActBlocksPerSm * num_sms;
  const int chunks = std::max(1, std::min((blocks + TK - 1) / TK, I / kActMinChunk));
  return ((I + chunks - 1) / chunks + 31) / 32 * 32;
}

static bool act_ilp3_enabled() {
  static const bool on = env_switch("QMOE_CUDA_ACT_ILP3");
  return on;
}

// The blocks of one row of `groups` 4-feature groups when each thread takes `ilp` of them: the
// threads a block (the row's share rounded to the warp, at most kActVecThreads) and the blocks a
// row; `idle` counts the (thread, group) slots that hold no group. Prefill takes 3 groups per
// thread where that idles fewer slots than 4 (qwen3-30b-a3b's I = 768: 192 groups, 64 threads × 3
// with none idle against 64 × 4 with a quarter idle).
struct ActRowBlocks {
  int threads, blocks, idle;
};
static ActRowBlocks act_row_blocks(int groups, int ilp) {
  const int per = (groups + ilp - 1) / ilp;  // threads per row
  const int threads = std::min(kActVecThreads, (per + 31) / 32 * 32);
  const int blocks = (per + threads - 1) / threads;
  return {threads, blocks, blocks * threads * ilp - groups};
}

void launch_act(const float* y1p, int ksplit, int TK, int I, const int32_t* slot_local, const float* b13,
                const ActParams& act, const RowQuant& q, const RowOut& out, bool defer, float* zbuf,
                unsigned* amax_bits, int num_sms, cudaStream_t s) {
  if (act_vec_mode(q, defer)) {
    // Many rows (prefill): 4 features per thread, and 4 such groups per thread (3 where that
    // idles fewer slots, act_row_blocks) once the groups fill kActVecWaves waves of resident
    // threads (fewer threads per SM would leave the per-thread chain exposed: qwen3-30b-a3b T = 64
    // ran 2.5 % slower with 4 groups), the block sized to the row's share (rounded to the warp);
    // few rows (decode), or a row that V = 4 does not fit: one feature per thread, 256-thread
    // blocks, 4 split partials at a time.
    if (act_vec4_fits(I, y1p, b13, q, out)) {  // WIP: V = 4 at decode too (measured 1.00-1.03x, untested)
      const int64_t groups = static_cast<int64_t>(TK) * (I / 4);
      int ilp = groups >= int64_t{kActVecWaves} * num_sms * 2048 ? 4 : 1;
      if (ilp == 4 && act_ilp3_enabled() && act_row_blocks(I / 4, 3).idle < act_row_blocks(I / 4, 4).idle) ilp = 3;
      const ActRowBlocks rb = act_row_blocks(I / 4, ilp);
      const int threads = rb.threads;
      const dim3 grid(TK, rb.blocks);
      if (ilp == 4)
        launch_pdl(act_vec_kernel<4, 4, 1>, grid, threads, 0, s, y1p, ksplit, TK, I, slot_local, b13, act, q, out);
      else if (ilp == 3)
        launch_pdl(act_vec_kernel<4, 3, 1>, grid, threads, 0, s, y1p, ksplit, TK, I, slot_local, b13, act, q, out);
      else
        launch_pdl(act_vec_kernel<4, 1, 4>, grid, threads, 0, s, y1p, ksplit, TK, I, slot_local, b13, act, q, out);
    } else {
      const int threads = std::min(kActVecThreads, (I + 31) / 32 * 32);
      launch_pdl(act_vec_kernel<1, 1, 4>, dim3(TK, (I + threads - 1) / threads), threads, 0, s, y1p, ksplit, TK, I,
                 slot_local, b13, act, q, out);
    }
    QMOE_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int cw = act_chunk(I, TK, q.mode, num_sms);
  const size_t smem = static_cast<size_t>(cw) * sizeof(float);
  static std::atomic<size_t> cfg{0};
  set_smem(reinterpret_cast<const void*>(act_kernel), smem, cfg);
  launch_pdl(act_kernel, dim3(TK, (I + cw - 1) / cw), row_threads(cw, TK), smem, s, y1p, ksplit, TK, I, cw, slot_local,
             b13, act, q, out, defer, zbuf, amax_bits);
  QMOE_CUDA_CHECK(cudaGetLastError());
}

__global__ void __launch_bounds__(kRowThreads) quant_rows_kernel(const float* zbuf, int I, const int32_t* slot_local,
                                                                 const RowQuant q, const RowOut o) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ float sz[];
  __shared__ float red[32];
  const int slot = blockIdx.x;
  if (slot_local[slot] < 0) return;
  for (int j = threadIdx.x; j < I; j += blockDim.x) sz[j] = zbuf[static_cast<int64_t>(slot) * I + j];
  __syncthreads();
  quantize_row(sz, I, q, o, slot, red);
}

void launch_quant_rows(const float* zbuf, int TK, int I, const int32_t* slot_local, const RowQuant& q,
                       const RowOut& out, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(I) * sizeof(float);
  static std::atomic<size_t> cfg{0};
  set_smem(reinterpret_cast<const void*>(quant_rows_kernel), smem, cfg);
  launch_pdl(quant_rows_kernel, TK, row_threads(I, TK), smem, s, zbuf, I, slot_local, q, out);
  QMOE_CUDA_CHECK(cudaGetLastError());
}

// ---- combine ---------------------------------------------------------------------------------
// Each thread owns V consecutive outputs of one token row (V = 4 where H and the output allow
// 16-byte accesses). The token's K routes are staged in shared memory first, then the K · ksplit
// partial loads of kCombineIlp routes at a time are issued together (at decode the grid is a few
// blocks and each thread's loads were a chain of round trips); the arithmetic is combine.cuh's.
template <int V>
__global__ void combine_kernel(const float* y2p, int ksplit, int T, int K, int H, const int32_t* slot_local,
                               const float* topk_w, bool on_input, const float* b2, float* out, bool accumulate,
                               const int32_t* bad) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ int s_route[];  // [K] local expert of the token's slots, then [K] routing weights
  float* s_w = reinterpret_cast<float*>(s_route + K);  // (unused when the weight was applied on the input)
  const int t = blockIdx.y;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    s_route[k] = slot_local[t * K + k];
    if (!on_input) s_w[k] = topk_w[t * K + k];
  }
  __syncthreads();
  const int h = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (h >= H) return;
  float* o = out + static_cast<int64_t>(t) * H + h;
  float acc[V] = {};
  if (bad[t]) {  // non-finite hidden states (quant_input_kernel)
    combine_store<V>(o, acc, true, accumulate);
    return;
  }
  combine_sum<V>(acc, y2p + static_cast<int64_t>(t) * K * H + h, static_cast<int64_t>(T) * K * H, ksplit, K, H, h,
                 [&](int k) { return s_route[k]; }, [&](int k) { return s_w[k]; }, b2, on_input);
  combine_store<V>(o, acc, false, accumulate);
}

void launch_combine(const float* y2p, int ksplit, int T, int K, int H, const int32_t* slot_local,
                    const float* topk_w, bool on_input, const float* b2, float* out, bool accumulate,
                    const int32_t* bad, cudaStream_t s) {
  const size_t smem = 2 * sizeof(int32_t) * static_cast<size_t>(K);
  // Prefill: 16-byte rows of y2p (cudaMalloc'd) and of the caller's output, when H is a multiple
  // of 4 and the output pointer 16-byte aligned; otherwise, and at decode, one float per thread.
  if (T >= kPrefillRows && H % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    static std::atomic<size_t> cfg{0};
    set_smem(reinterpret_cast<const void*>(combine_kernel<4>), smem, cfg);
    launch_pdl(combine_kernel<4>, dim3((H / 4 + 255) / 256, T), 256, smem, s, y2p, ksplit, T, K, H, slot_local,
               topk_w, on_input, b2, out, accumulate, bad);
  } else {
    static std::atomic<size_t> cfg{0};
    set_smem(reinterpret_cast<const void*>(combine_kernel<1>), smem, cfg);
    launch_pdl(combine_kernel<1>, dim3((H + 255) / 256, T), 256, smem, s, y2p, ksplit, T, K, H, slot_local, topk_w,
               on_input, b2, out, accumulate, bad);
  }
  QMOE_CUDA_CHECK(cudaGetLastError());
}

// ---- random fill (benchmarks) ----------------------------------------------------------------
__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void random_fill_kernel(void* p, int64_t count, RandKind kind, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = lo + (hi - lo) * u;
    switch (kind) {
      case RandKind::Bytes: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(r); break;
      case RandKind::Fp8Codes: {
        uint8_t b = static_cast<uint8_t>(r);
        if ((b & 0x7F) == 0x7F) b ^= 1;
        static_cast<uint8_t*>(p)[i] = b;
        break;
      }
      case RandKind::Bf16Values: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
      case RandKind::E8M0Scales: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(lo + static_cast<float>(r % static_cast<uint64_t>(hi - lo + 1))); break;
      case RandKind::Fp8Scales: static_cast<uint8_t*>(p)[i] = fp8_e4m3_encode(v); break;
      case RandKind::Nvfp4KernelScales: {
        const uint8_t c = fp8_e4m3_encode(v);
        static_cast<uint8_t*>(p)[i] = (c & 0x7F) == 0 ? uint8_t{0} : nvfp4_scale_byte(c);
        break;
      }
      case RandKind::F32Values: static_cast<float*>(p)[i] = v; break;
    }
  }
}

void launch_random_fill(void* p, int64_t count, RandKind kind, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (count <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 8192));
  random_fill_kernel<<<blocks, 256, 0, s>>>(p, count, kind, seed, lo, hi);
  QMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace qmoe::cuda
