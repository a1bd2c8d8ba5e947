// The CPU GEMM kernels, written once against a target's ISA layer T (simd/avx2.h, simd/avx512.h)
// and compiled once per target by that target's translation unit (gemm_<target>.cc, with its -m
// flags; CMakeLists.txt). Selected at run time through KernelTable (kernels_scalar.cc).
//
// Row-major micro-kernels over T::kNR weight rows × up to T::kNT tokens: each weight vector is
// decoded once in registers from the packed format and used for every token of the group; one
// fp32 / int32 accumulator vector per (token, row), reduced horizontally at the end of the row.
//   F32 : 32 weights per step (64 for fp4) decoded by T::dec_* (block scale folded into a table
//         for fp4; shift/mask bit tricks for fp8 / fp6, checked against formats.h by the tests),
//         then FMA with the fp32 activation values. Experts with more tokens than one group decode
//         their rows once into a per-thread buffer.
//   I8  : T::i8_dot steps of T::kI8Step codes (vpdpbusd on AVX-512, vpmaddwd on AVX2), exact
//         int32, minus T::kI8Offset·Σcodes.
// What T provides: vector types F / I, kLanes, kNR, kNT, zero / loadu / storeu / fmadd,
// hsum_rows, the decoders dec_f32 / dec_half / dec_fp8 / dec_i8 / dec_fp6 / dec_fp4 (+ fp4_base),
// the I8 step (kI8Step, kI8Offset, izero, i8_act, i8_weights, i8_dot, hsum_rows_i32), the W4A4
// step (w4_*, kW4Rows, kW4LaneAct; w6_weights where kW6Int), speed choices measured per target
// (kPlainRowBuffer, kOneTokenAcc, kEvenTokenGroups), and flags for target-only kernels (kMxfp4F32Kernel, kBf16Dot),
// defined in the target's own files, as is its W4A4 kernel (gemm_w4a4).
// No library inline code here: only intrinsics (through T) and this header's own functions, all
// with internal linkage, so nothing compiled for one target can be picked by the linker for
// another.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/kernel_iface.h"

namespace qmoe::cpu {
namespace {

constexpr int64_t kPrefetchBytes = 8192;  // software prefetch distance (see prefetch_seq)

// Row-major kernels read kNR rows interleaved, each a short stream, which the hardware
// prefetchers follow poorly (measured on Zen 4: ~10 GB/s against ~17 GB/s sequential, one core).
// So they prefetch a later row block in address order: step s of row i fetches the bytes
// (s·nr + i)·bytes_per_step of the block at distance ≥ kPrefetchBytes, which sweeps that block
// sequentially while the current one is consumed (measured back to ~16 GB/s).
inline int64_t prefetch_distance(int64_t block_bytes) {
  return block_bytes <= 0 ? 0 : (kPrefetchBytes + block_bytes - 1) / block_bytes * block_bytes;
}

// The size of the token group that starts at token j0 of n, for the integer kernels (INT8 W8A8,
// W4A4 rows): groups of at most T::kNT, and on targets with T::kEvenTokenGroups as even as the
// count allows (9 tokens 3 + 3 + 3 rather than 4 + 4 + 1), so that no group takes the rows for one
// token after the others took four.
template <class T>
inline int token_group(int n, int j0) {
  const int left = n - j0;
  if constexpr (!T::kEvenTokenGroups) return left < T::kNT ? left : T::kNT;
  const int groups = (left + T::kNT - 1) / T::kNT;
  return (left + groups - 1) / groups;
}

// kHint: _MM_HINT_T0 (into L1) for the kernels that decode each weight at some cost (fp4 / fp6
// codes: the L1 copy is there when the decode wants it), _MM_HINT_T1 (into L2) for the byte-wide
// and wider streams — bf16, int8 and fp8 weights — so that the L1 fill buffers stay with the
// demand loads. Measured on the AMX Xeon, qwen3-30b-a3b, 2 threads, interleaved rounds: INT8
// W8A8 T = 16 15.2–19.4 → 14.2–17.1 ms, bf16 weights +bf16act T = 16 35.4–37.4 → 31.4–32.2 ms,
// bf16 weights T = 1 3.9–4.5 → 3.1–3.3 ms; MXFP4 W4A4 0.93–0.96× with T1, so the 4- and 6-bit
// formats keep T0 (bench/RESULTS.md 2026-12-05 evening). FP8 weights on the F32 kind (one core,
// K = 2048, N = 1536, one token, cold): 367–382 → 295–303 µs with T1 (RESULTS 2026-12-05, late).
template <auto kHint = _MM_HINT_T0>
inline void prefetch_seq(const uint8_t* block, int64_t dist, int step, int i, int nr, int bytes_per_step) {
  const uint8_t* p = block + dist + (static_cast<int64_t>(step) * nr + i) * bytes_per_step;
  for (int off = 0; off < bytes_per_step; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), kHint);
}

template <int NR>
struct RowSet {
  const uint8_t* row[NR];
  const uint8_t* scales[NR];
};

template <int NR>
RowSet<NR> row_set(const WeightView& w, const int* rows, int scale_cols) {
  RowSet<NR> r;
  for (int i = 0; i < NR; ++i) {
    r.row[i] = w.data + static_cast<int64_t>(rows[i]) * w.row_bytes;
    r.scales[i] = w.scales ? w.scales + static_cast<int64_t>(rows[i]) * scale_cols : nullptr;
  }
  return r;
}

// Decoders of bf16 / fp32 / int8 / fp8 rows (kL2Prefetch) have their rows prefetched into L2
// (prefetch_seq); the others into L1.
template <class D>
constexpr bool l2_prefetch_of() {
  if constexpr (requires { D::kL2Prefetch; }) return D::kL2Prefetch;
  return false;
}
// Whether the one-token kernels read D's rows one after the other (a single sequential stream)
// instead of kNR interleaved: the plain streams (kL2Prefetch) and decoders that say so
// (kRowStream); the costly decodes (MXFP6, NVFP4, the block-factor MX decoders) keep the
// interleaved rows, which measured faster for them (MXFP6 on the F32 kind 0.89–0.9× one row at a
// time; bench/RESULTS.md 2026-12-05 late).
template <class D>
constexpr bool row_stream_of() {
  if constexpr (requires { D::kRowStream; }) return D::kRowStream;
  return l2_prefetch_of<D>();
}
// The one-row streams' prefetch: the line `dist` (row_stream_distance()) past p, the row's bytes
// being read.
template <auto kHint>
inline void row_stream_prefetch(const uint8_t* p, int64_t dist) {
  _mm_prefetch(reinterpret_cast<const char*>(p + dist), kHint);
}
// The same for step k of row slot i of decoder D (into L2 for the plain streams, else L1).
template <class D>
inline void row_stream_prefetch(const D& dec, int i, int k, int64_t dist) {
  row_stream_prefetch<l2_prefetch_of<D>() ? _MM_HINT_T1 : _MM_HINT_T0>(dec.rs.row[i] + (k / D::kStep) * D::kBytes, dist);
}

// A contiguous block (the next weight rows a kernel will decode) prefetched into L2 while the
// current one computes, spread evenly over the `steps` steps of that pass: at(step) issues the
// block's lines for that step (none where base is null). Used by the AVX-512 W4A4 tiles and the Bf16
// kind's row buffer (bench/RESULTS.md 2026-12-06, session 41).
struct SpreadPrefetch {
  const uint8_t* base = nullptr;
  int per_step = 0;  // lines per step
  static SpreadPrefetch over(const uint8_t* p, int64_t bytes, int steps) {
    const int64_t lines = (bytes + 63) / 64;
    return {p, static_cast<int>((lines + steps - 1) / steps)};
  }
  void at(int step) const {
    if (base == nullptr) return;
    const uint8_t* p = base + int64_t{64} * step * per_step;
    for (int j = 0; j < per_step; ++j) _mm_prefetch(reinterpret_cast<const char*>(p + 64 * j), _MM_HINT_T1);
  }
};

// Software prefetch of a later row block in address order (prefetch_seq).
template <int NR>
struct Prefetch {
  const uint8_t* base = nullptr;  // row n0 of the block (null: data already in cache)
  int64_t dist = 0;               // bytes ahead
  int64_t row_dist = 0;           // the one-row streams' distance (row_stream_distance())
  int q4 = 4;                     // bytes per element × 4 (a constant divisor: no idiv per step)
  // For decoder D's rows (its kStep / kBytes; into L2 where l2_prefetch_of<D>, else into L1).
  template <class D>
  void at(int i, int k) const {
    if (base == nullptr) return;
    prefetch_seq<l2_prefetch_of<D>() ? _MM_HINT_T1 : _MM_HINT_T0>(base, dist, k / D::kStep, i, NR, D::kStep * q4 / 4);
  }
  // The same sweep for all NR rows of step s at once — kBytes per row and step, a compile-time
  // constant: NR · kBytes / 64 prefetches with one address, where NR calls of at() cost an address
  // product and a loop each (MXFP6's 24-byte steps: ~9 instructions per row and 32 weights).
  template <class D>
  void block_at(int s) const {
    constexpr int kBytes = D::kBytes;
    if (base == nullptr) return;
    const uint8_t* p = base + dist + static_cast<int64_t>(s) * (NR * kBytes);
    constexpr auto kHint = l2_prefetch_of<D>() ? _MM_HINT_T1 : _MM_HINT_T0;
#pragma GCC unroll 16
    for (int off = 0; off < NR * kBytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), kHint);
  }
};
template <int NR>
Prefetch<NR> prefetch_of(const WeightView& w, int n0) {
  Prefetch<NR> p;
  p.base = w.data + static_cast<int64_t>(n0) * w.row_bytes;
  p.dist = prefetch_distance(NR * w.row_bytes);
  p.row_dist = row_stream_distance();
  switch (w.fmt) {
    case WeightFormat::BF16: p.q4 = w.dtype == DType::F32 ? 16 : 8; break;
    case WeightFormat::Mxfp4:
    case WeightFormat::Nvfp4: p.q4 = 2; break;
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: p.q4 = 3; break;
    default: break;
  }
  return p;
}

// Decoders may produce weights × 2^−s (kPostScale = 2^s restores them in the epilogue).
template <class D>
constexpr double post_scale_of() {
  if constexpr (requires { D::kPostScale; }) return D::kPostScale;
  return 1.0;
}

// Output of one (row block, token group): y = fl32(dot · rs · ws + bias) in double (separate mul /
// add roundings), then × router weight. Full row blocks (nr == C) take compile-time loops that
// the compiler vectorises, and the per-row scale / bias setup is a fill when the weights have a
// tensor scale and no bias (measured on a Zen 5: the scalar form was ~10 % of a decode GEMM2 over
// 768-wide rows, bench/RESULTS.md 2026-12-03 late).
template <class Dot, int C>
inline void epilogue(const GemmArgs& a, int n0, int nr, int j0, int nt, const Dot (*dot)[C], double post_scale = 1.0) {
  const WeightView& w = *a.w;
  double ws[C], bias[C];
  if (w.channel_scale == nullptr && w.bias == nullptr) {
    const double s = static_cast<double>(w.tensor_scale) * post_scale;
    for (int i = 0; i < C; ++i) {
      ws[i] = s;
      bias[i] = 0.0;
    }
  } else {
    for (int i = 0; i < C; ++i) {
      const int n = n0 + (i < nr ? i : nr - 1);
      ws[i] = (w.channel_scale ? static_cast<double>(w.channel_scale[n]) : static_cast<double>(w.tensor_scale)) * post_scale;
      bias[i] = w.bias ? static_cast<double>(bias_value(w, n)) : 0.0;
    }
  }
  // Outputs [0, count) of one token (count = C at compile time for a full block).
  auto emit = [&](auto full, auto with_pm, const Dot* d, double rs, float pm, float* out) {
    const int count = decltype(full)::value ? C : nr;
    for (int i = 0; i < count; ++i) {
      const double p = static_cast<double>(d[i]) * rs;
      float y = static_cast<float>(p * ws[i] + bias[i]);
      if constexpr (decltype(with_pm)::value) y *= pm;
      out[i] = y;
    }
  };
  for (int t = 0; t < nt; ++t) {
    const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * a.layout->stride;
    float rs;
    std::memcpy(&rs, row, 4);
    float* out = a.out + static_cast<int64_t>(j0 + t) * a.ldo + n0;
    const double rsd = static_cast<double>(rs);
    if (a.post_mul) {
      const float pm = a.post_mul[j0 + t];
      if (nr == C) emit(std::true_type{}, std::true_type{}, dot[t], rsd, pm, out);
      else emit(std::false_type{}, std::true_type{}, dot[t], rsd, pm, out);
    } else {
      if (nr == C) emit(std::true_type{}, std::false_type{}, dot[t], rsd, 1.0f, out);
      else emit(std::false_type{}, std::false_type{}, dot[t], rsd, 1.0f, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// F32 decoders: load(i, k, w) gives the kStep weights [k, k + kStep) of row slot i in activation
// value order (zeros beyond K) as kStep / T::kLanes vectors; load_full the same for a step wholly
// inside K, with no bounds test. The kernels' steady loops take load_full: a tail path there (its
// zero-padded copy is a library call on AVX2) had GCC keep the one-token row stream's accumulators
// on the stack, a store-to-load round trip in every FMA chain. On Zen 3 (one core, bf16 K = 2048,
// N = 1536) neither this nor the 1 KB prefetch distance (row_stream_distance) moved the time alone
// (~460 µs); both together gave 327–344 µs (bench/RESULTS.md 2026-12-06, session 42).
template <class T>
struct DecF32 {
  RowSet<T::kNR> rs;
  int K;
  static constexpr int kStep = 32, kBytes = 128;  // weights and bytes per row and step
  static constexpr bool kL2Prefetch = true;
  void load(int i, int k, typename T::F* w) const { T::dec_f32(reinterpret_cast<const float*>(rs.row[i]) + k, K - k, w); }
  void load_full(int i, int k, typename T::F* w) const { T::dec_f32(reinterpret_cast<const float*>(rs.row[i]) + k, kStep, w); }
};

template <class T, bool kBf16>
struct DecHalf {
  RowSet<T::kNR> rs;
  int K;
  static constexpr int kStep = 32, kBytes = 64;
  static constexpr bool kL2Prefetch = true;
  void load(int i, int k, typename T::F* w) const { T::template dec_half<kBf16>(rs.row[i] + 2 * k, K - k, w); }
  void load_full(int i, int k, typename T::F* w) const { T::template dec_half<kBf16>(rs.row[i] + 2 * k, kStep, w); }
};

// FP8 (the value × 2^−8) or INT8.
template <class T, bool kFp8>
struct DecByte {
  RowSet<T::kNR> rs;
  int K;
  static constexpr int kStep = 32, kBytes = 32;
  static constexpr double kPostScale = kFp8 ? 256.0 : 1.0;
  static constexpr bool kL2Prefetch = true;
  void load(int i, int k, typename T::F* w) const { load_n(i, k, K - k, w); }
  void load_full(int i, int k, typename T::F* w) const { load_n(i, k, kStep, w); }
  void load_n(int i, int k, int n, typename T::F* w) const {
    if (kFp8) T::dec_fp8(rs.row[i] + k, n, w);
    else T::dec_i8(rs.row[i] + k, n, w);
  }
};

// MXFP4 (one factor per 32-group) / NVFP4 (bytes 0..7 and 8..15 of a group are two 16-blocks):
// 64 weights per step in act order [even g | even g+1 | odd g | odd g+1] (ActLayout).
template <class T, bool kMx>
struct DecFp4 {
  RowSet<T::kNR> rs;
  int K;
  const float* table;  // E8M0 or F8_E4M3 values
  float ws2;
  typename T::F base;  // T::fp4_base()
  static constexpr int kStep = 64, kBytes = 32;
  // kFull: the step lies wholly inside K (k + kStep ≤ K), no bounds tests (load_full).
  template <bool kFull>
  void load_at(int i, int k, typename T::F* w) const {
    const int g = k >> 5;  // first group of the chunk
    const uint8_t* sc = rs.scales[i];
    auto factor = [&](int b, int nblocks) {
      if (!kFull && b >= nblocks) return 0.0f;
      return kMx ? table[sc[b]] : table[sc[b]] * ws2;
    };
    float f[4];
    if (kMx) {
      f[0] = factor(g, K >> 5);
      f[1] = factor(g + 1, K >> 5);
    } else {
      for (int j = 0; j < 4; ++j) f[j] = factor(2 * g + j, K >> 4);
    }
    T::template dec_fp4<kMx>(rs.row[i] + (k >> 1), kFull ? kBytes : (K - k) >> 1, f, base, w);
  }
  void load(int i, int k, typename T::F* w) const { load_at<false>(i, k, w); }
  void load_full(int i, int k, typename T::F* w) const { load_at<true>(i, k, w); }
};

template <class T, bool kE2M3>
struct DecFp6 {
  RowSet<T::kNR> rs;
  int K;
  const float* e8;
  static constexpr int kStep = 32, kBytes = 24;
  void load(int i, int k, typename T::F* w) const {
    T::template dec_fp6<kE2M3>(rs.row[i] + (k >> 2) * 3, e8[rs.scales[i][k >> 5]], w);
  }
};

// Decoded rows in a per-thread fp32 buffer (used when an expert has more tokens than one group).
template <class T>
struct DecBuf {
  const float* buf;
  int ld;
  static constexpr int kStep = 32, kBytes = 0;  // (never prefetched)
  void load(int i, int k, typename T::F* w) const {
    for (int v = 0; v < kStep / T::kLanes; ++v) w[v] = T::loadu(buf + static_cast<int64_t>(i) * ld + k + T::kLanes * v);
  }
};

// One decoder step: load_full (no bounds tests) for kFull::value, else load. A function template
// rather than an `if constexpr` inside f32_kernel's generic lambda, where clang checks the
// load_full call for decoders that lack it.
template <class D, class W, class kFull>
__attribute__((always_inline)) inline void dec_step(const D& dec, int i, int k, W* w, kFull) {
  if constexpr (kFull::value) dec.load_full(i, k, w);
  else dec.load(i, k, w);
}

template <class T, class D, int NT>
void f32_kernel(const D& dec, const Prefetch<T::kNR>& pf, const float* const* act, int kend, float (*res)[T::kNR]) {
  constexpr int kNR = T::kNR;
  constexpr int V = D::kStep / T::kLanes;
  typename T::F acc[NT][kNR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = T::zero();
  if constexpr (NT == 1 && D::kBytes > 0 && row_stream_of<D>()) {
    // One token: one weight row after the other, a single sequential stream prefetched
    // row_stream_distance() ahead (DECISIONS "Row order of the row-major decode kernels"). One core, cold,
    // K = 2048 / 768: bf16 weights 444–446 → 355–358 / 225–227 → 185 µs (AVX2 code 518–521 → 337–343),
    // FP8 292–298 → 222–225 / 144–145 → 114 (bench/RESULTS.md 2026-12-05 late).
    if (pf.base != nullptr) {
      for (int i = 0; i < kNR; ++i) {
        typename T::F a[V];
        for (int v = 0; v < V; ++v) a[v] = T::zero();
        auto rstep = [&](int k, auto full) {
          row_stream_prefetch(dec, i, k, pf.row_dist);
          typename T::F w[V];
          dec_step(dec, i, k, w, full);
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) a[v] = T::fmadd(w[v], T::loadu(act[0] + k + T::kLanes * v), a[v]);
        };
        int k = 0;
        if constexpr (requires(typename T::F* w) { dec.load_full(0, 0, w); })
          for (const int kfull = dec.K / D::kStep * D::kStep; k < kfull; k += D::kStep) rstep(k, std::true_type{});
        for (; k < kend; k += D::kStep) rstep(k, std::false_type{});
        for (int v = 1; v < V; ++v) a[0] = T::add(a[0], a[v]);
        acc[0][i] = a[0];
      }
      T::hsum_rows(acc[0], res[0]);
      return;
    }
  }
  // One token, interleaved rows, steps of V ≤ T::kOneTokenAcc vectors (MXFP6 and the row buffer
  // on AVX2): one accumulator per vector and row, so that a step's FMAs form V chains rather than
  // one. NVFP4's 8-vector steps keep one (4 accumulators there: 537 → 577 µs, Zen 3, one core,
  // K = 2048, N = 1536; bench/RESULTS.md 2026-12-07).
  constexpr int A = NT == 1 && V <= T::kOneTokenAcc ? V : 1;  // V (acc1[i][v]) or 1 (acc1 unused)
  typename T::F acc1[kNR][A];
  for (int i = 0; i < kNR; ++i)
    for (int j = 0; j < A; ++j) acc1[i][j] = T::zero();
  auto step = [&](int k, auto full) {
    if constexpr (D::kBytes > 0) pf.template block_at<D>(k / D::kStep);
#pragma GCC unroll 4
    for (int i = 0; i < kNR; ++i) {
      typename T::F w[V];
      dec_step(dec, i, k, w, full);
      if constexpr (A > 1) {
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc1[i][v] = T::fmadd(w[v], T::loadu(act[0] + k + T::kLanes * v), acc1[i][v]);
      } else {
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) acc[t][i] = T::fmadd(w[v], T::loadu(act[t] + k + T::kLanes * v), acc[t][i]);
      }
    }
  };
  int k = 0;
  // Steps wholly inside K without the decoder's bounds tests, where it has that form.
  if constexpr (requires(typename T::F* w) { dec.load_full(0, 0, w); })
    for (const int kfull = dec.K / D::kStep * D::kStep; k < kfull; k += D::kStep) step(k, std::true_type{});
  for (; k < kend; k += D::kStep) step(k, std::false_type{});
  if constexpr (A > 1)
    for (int i = 0; i < kNR; ++i) {
      for (int j = 1; j < A; ++j) acc1[i][0] = T::add(acc1[i][0], acc1[i][j]);
      acc[0][i] = acc1[i][0];
    }
  for (int t = 0; t < NT; ++t) T::hsum_rows(acc[t], res[t]);
}

template <class T, class D>
void f32_group(const D& dec, const Prefetch<T::kNR>& pf, const float* const* act, int nt, int kend, float (*res)[T::kNR]) {
  switch (nt) {
    case 1: f32_kernel<T, D, 1>(dec, pf, act, kend, res); break;
    case 2: f32_kernel<T, D, 2>(dec, pf, act, kend, res); break;
    case 3: f32_kernel<T, D, 3>(dec, pf, act, kend, res); break;
    default: f32_kernel<T, D, 4>(dec, pf, act, kend, res); break;
  }
}

template <class T, class D, class Make>
void run_f32(const GemmArgs& a, Make make_dec) {
  constexpr int kNR = T::kNR, kNT = T::kNT;
  const ActLayout& l = *a.layout;
  const int K = a.w->cols;
  const int kend = (K + D::kStep - 1) / D::kStep * D::kStep;  // ≤ k_pad; decoders zero-fill past K
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    int rows[kNR];
    for (int i = 0; i < kNR; ++i) rows[i] = n0 + (i < nr ? i : nr - 1);
    const D dec = make_dec(rows);
    float dot[kNT][kNR];
    // A few tokens, or plain-stream rows (bf16 / fp32 / fp8 / int8: a cheap decode) on targets
    // without kPlainRowBuffer: each token group decodes the rows itself (the block's rows stay in
    // L1 / L2 after the first group, which alone prefetches). AVX2 on Zen 3, one core, K = 2048, ns per
    // token, row and 64 weights against the row buffer: bf16 at 8 tokens 3.80–3.84 → 2.56–3.03
    // (DRAM), 3.32 → 2.46–2.69 (L2), 16 tokens 3.15 → 2.57–3.10, 32 tokens level; fp8 at 8 tokens
    // 4.60 → 2.88 (bench/RESULTS.md 2026-12-06, session 42).
    if (a.ntok <= kNT || (!T::kPlainRowBuffer && l2_prefetch_of<D>())) {
      for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
        const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
        const float* act[kNT];
        for (int t = 0; t < nt; ++t)
          act[t] = reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride + l.vals_off);
        f32_group<T>(dec, j0 == 0 ? prefetch_of<kNR>(*a.w, n0) : Prefetch<kNR>{}, act, nt, kend, dot);
        epilogue(a, n0, nr, j0, nt, dot, post_scale_of<D>());
      }
      continue;
    }
    // Many tokens: decode the kNR rows once into an L1/L2-resident buffer.
    float* buf = static_cast<float*>(thread_scratch_buffer(0, sizeof(float) * kNR * static_cast<size_t>(kend)));
    const Prefetch<kNR> pf = prefetch_of<kNR>(*a.w, n0);
    for (int i = 0; i < kNR; ++i)
      for (int k = 0; k < kend; k += D::kStep) {
        pf.template at<D>(i, k);
        typename T::F w[D::kStep / T::kLanes];
        dec.load(i, k, w);
        for (int v = 0; v < D::kStep / T::kLanes; ++v) T::storeu(buf + static_cast<int64_t>(i) * kend + k + T::kLanes * v, w[v]);
      }
    const DecBuf<T> bdec{buf, kend};
    for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
      const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
      const float* act[kNT];
      for (int t = 0; t < nt; ++t)
        act[t] = reinterpret_cast<const float*>(a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride + l.vals_off);
      f32_group<T>(bdec, Prefetch<kNR>{}, act, nt, kend, dot);
      epilogue(a, n0, nr, j0, nt, dot, post_scale_of<D>());
    }
  }
}

// Target-only kernels, defined (specialized) by the target's own translation units: the W4A4
// kinds where a target adds to the row-major kernel (AVX-512: 16-row tiles), MXFP4 weights on the F32 kind where T::kMxfp4F32Kernel, the Bf16 kind
// where T::kBf16Dot; never instantiated for the others.
template <class T, bool kMx>
void gemm_w4a4(const GemmArgs& a);  // generic: gemm_w4a4_rows below
template <class T>
void gemm_mxfp4_f32(const GemmArgs& a);
template <class T>
void gemm_bf16(const GemmArgs& a);

// MXFP4 weights on the F32 kind through the generic kernel (DecFp4; the targets' own
// gemm_mxfp4_f32 hands it the token counts it does not take).
template <class T>
void run_f32_mxfp4(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const int K = w.cols;
  const typename T::F base = T::fp4_base();
  const float* e8 = e8m0_table();
  run_f32<T, DecFp4<T, true>>(a, [&](const int* r) { return DecFp4<T, true>{row_set<T::kNR>(w, r, K / 32), K, e8, 1.0f, base}; });
}

template <class T>
void gemm_f32(const GemmArgs& a) {
  constexpr int kNR = T::kNR;
  const WeightView& w = *a.w;
  const int K = w.cols;
  switch (w.fmt) {
    case WeightFormat::BF16:
      if (w.dtype == DType::BF16)
        run_f32<T, DecHalf<T, true>>(a, [&](const int* r) { return DecHalf<T, true>{row_set<kNR>(w, r, 0), K}; });
      else if (w.dtype == DType::F16)
        run_f32<T, DecHalf<T, false>>(a, [&](const int* r) { return DecHalf<T, false>{row_set<kNR>(w, r, 0), K}; });
      else
        run_f32<T, DecF32<T>>(a, [&](const int* r) { return DecF32<T>{row_set<kNR>(w, r, 0), K}; });
      break;
    case WeightFormat::Fp8E4M3:
      run_f32<T, DecByte<T, true>>(a, [&](const int* r) { return DecByte<T, true>{row_set<kNR>(w, r, 0), K}; });
      break;
    case WeightFormat::Int8:
      run_f32<T, DecByte<T, false>>(a, [&](const int* r) { return DecByte<T, false>{row_set<kNR>(w, r, 0), K}; });
      break;
    case WeightFormat::Mxfp4:
      if constexpr (T::kMxfp4F32Kernel) gemm_mxfp4_f32<T>(a);
      else run_f32_mxfp4<T>(a);
      break;
    case WeightFormat::Nvfp4: {
      const typename T::F base = T::fp4_base();
      const float* f8 = fp8_e4m3_table();
      run_f32<T, DecFp4<T, false>>(a, [&](const int* r) { return DecFp4<T, false>{row_set<kNR>(w, r, K / 16), K, f8, w.nv_global, base}; });
      break;
    }
    case WeightFormat::Mxfp6E2M3: {
      const float* e8 = e8m0_table();
      run_f32<T, DecFp6<T, true>>(a, [&](const int* r) { return DecFp6<T, true>{row_set<kNR>(w, r, K / 32), K, e8}; });
      break;
    }
    case WeightFormat::Mxfp6E3M2: {
      const float* e8 = e8m0_table();
      run_f32<T, DecFp6<T, false>>(a, [&](const int* r) { return DecFp6<T, false>{row_set<kNR>(w, r, K / 32), K, e8}; });
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// I8: int8 codes × int8 weights, exact int32 sums.
template <class T, int NT>
void i8_kernel(const uint8_t* const* w, int64_t stride, const uint8_t* const* act, int K, int32_t (*res)[T::kNR]) {
  constexpr int kNR = T::kNR;
  const int64_t dist = prefetch_distance(kNR * stride);
  typename T::I acc[NT][kNR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = T::izero();
  if constexpr (NT == 1 && T::kI8RowStream) {
    // One token: one weight row after the other, a single sequential stream, prefetched
    // row_stream_distance() ahead (one core, K = 2048, N = 1536, cold: 200–207 → 185–192 µs, ~100 % of the
    // one-thread read probe; K = 768: 97–101 → 87–91; bench/RESULTS.md 2026-12-05 late). AVX2: kI8RowStream off.
    const int64_t row_dist = row_stream_distance();
    for (int i = 0; i < kNR; ++i) {
      typename T::I a1 = T::izero();
      for (int k = 0; k < K; k += T::kI8Step) {
        if ((k & 63) == 0) row_stream_prefetch<_MM_HINT_T1>(w[i] + k, row_dist);
        a1 = T::i8_dot(a1, T::i8_weights(w[i] + k, K - k), T::i8_act(act[0] + k));
      }
      acc[0][i] = a1;
    }
    T::hsum_rows_i32(acc[0], res[0]);
    return;
  }
  // Steps wholly inside K with a constant count (no bounds test: the tail's zero-padding path
  // inside the steady loop had GCC keep an accumulator in memory; AVX2, Zen 3, one core, K = 2048,
  // N = 1536, 8 tokens: see bench/RESULTS.md 2026-12-07, session 45), then the tail.
  auto step = [&](int k, auto full) {
    typename T::I av[NT];
    for (int t = 0; t < NT; ++t) av[t] = T::i8_act(act[t] + k);
    for (int i = 0; i < kNR; ++i) {
      if ((k & 63) == 0) prefetch_seq<_MM_HINT_T1>(w[0], dist, k >> 6, i, kNR, 64);  // a plain stream (as DecByte's)
      const typename T::I wv = T::i8_weights(w[i] + k, decltype(full)::value ? T::kI8Step : K - k);
      for (int t = 0; t < NT; ++t) acc[t][i] = T::i8_dot(acc[t][i], wv, av[t]);
    }
  };
  const int kfull = K / T::kI8Step * T::kI8Step;
  int k = 0;
  for (; k < kfull; k += T::kI8Step) step(k, std::true_type{});
  for (; k < K; k += T::kI8Step) step(k, std::false_type{});
  for (int t = 0; t < NT; ++t) T::hsum_rows_i32(acc[t], res[t]);
}

template <class T>
void gemm_i8(const GemmArgs& a) {
  constexpr int kNR = T::kNR, kNT = T::kNT;
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    const uint8_t* wr[kNR];
    for (int i = 0; i < kNR; ++i) wr[i] = w.data + static_cast<int64_t>(n0 + (i < nr ? i : nr - 1)) * w.row_bytes;
    for (int j0 = 0, nt = 0; j0 < a.ntok; j0 += nt) {
      nt = token_group<T>(a.ntok, j0);
      const uint8_t* act[kNT];
      int32_t sums[kNT];
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride;
        act[t] = row + l.vals_off;
        std::memcpy(&sums[t], row + 4, 4);
      }
      int32_t ires[kNT][kNR];
      switch (nt) {
        case 1: i8_kernel<T, 1>(wr, w.row_bytes, act, K, ires); break;
        case 2: i8_kernel<T, 2>(wr, w.row_bytes, act, K, ires); break;
        case 3: i8_kernel<T, 3>(wr, w.row_bytes, act, K, ires); break;
        default: i8_kernel<T, 4>(wr, w.row_bytes, act, K, ires); break;
      }
      double dot[kNT][kNR];
      for (int t = 0; t < nt; ++t)
        for (int i = 0; i < kNR; ++i) dot[t][i] = static_cast<double>(ires[t][i] - T::kI8Offset * sums[t]);
      epilogue(a, n0, nr, j0, nt, dot);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// W4A4 (Fp4Mx / Fp4Nv), row-major: exact int8 dot products of 2·e2m1 values. Weights decode to
// u8 (2·e2m1 + 12) (T::w4_weights; MXFP6 E2M3 weights 8·e2m3 + 60, T::w6_weights), activations are
// the layout's int8 values (signed: 2·e2m1, 8·e2m3); T::w4_dot forms per lane the exact int32 sum
// of one block's products plus the layout's correction words (−w_offset · Σ of the values,
// ActLayout::corr_off), which remove the offset. Each
// lane is converted to fp32 (exact, |·| < 2^24), × (activation block scale · weight block
// factor, T::w4_lane_scales / w4_weight_scales of T::w4_row_factors) and added to an fp32 accumulator (MX: powers of two, exact
// products). Rows come in blocks of 4, T::kW4Rows<NT> at a time.
struct Fp4Act {
  const int8_t* v;      // values, stored order
  const float* scale;   // per block (≥ 16 zero floats after the last)
  const int32_t* corr;  // per 4 stored values: −12 · their sum (ActLayout::corr_off)
  // T::kW4LaneAct targets, several tokens: per 64-chunk c the token's lane vectors at c · kLanes,
  // built once per call (T::w4_lane_act): the lane scales and the lane correction words.
  const float* lane_scale = nullptr;
  const int32_t* lane_corr = nullptr;
};
constexpr int kW4Block = 4;  // rows per block (factor buffers, epilogue)

// The weights of the 64-chunk at k of a row: MXFP4 / NVFP4 (32 bytes, T::w4_weights) or, kW6, MXFP6
// E2M3 (48 bytes, T::w6_weights), `kFull`: the whole chunk inside K (else zero padded).
template <class T, bool kFull, bool kW6>
__attribute__((always_inline)) inline typename T::W4 w4_chunk(const uint8_t* row, int k, int K) {
  if constexpr (kW6) return T::template w6_weights<kFull>(row + (k >> 2) * 3, ((K - k) >> 2) * 3);
  else return T::template w4_weights<kFull>(row + (k >> 1), (K - k) >> 1);
}

// One 64-chunk of NR rows (from r0) × NT tokens (kFull: all 64 elements inside K, else zero padded).
template <class T, bool kMx, int NT, int NR, bool kFull, bool kBits, bool kW6>
__attribute__((always_inline)) inline void w4_step(const uint8_t* const* rows, const typename T::template W4Factors<kMx>* wf,
                                                   int r0, const Fp4Act* act, int k, int K, typename T::F (&acc)[NT][NR]) {
  using F = typename T::F;
  const int b = kMx ? k >> 5 : k >> 4;  // first block of the chunk
  const int nb = kMx ? K >> 5 : K >> 4;
  if constexpr (NT == 1) {
    // The token's chunk first, then each row decoded and used at once (few live registers).
    const typename T::W4A av = T::w4_act(act[0].v + k);
    const F as = T::template w4_lane_scales<kMx>(act[0].scale + b);
    const typename T::I cv = T::w4_corr(act[0].corr + (k >> 2));
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      const typename T::W4 w = w4_chunk<T, kFull, kW6>(rows[r0 + i], k, K);
      const F ws = T::template w4_weight_scales<kMx, kFull, kBits>(wf[r0 + i], b, nb);
      acc[0][i] = T::fmadd(T::cvt_i32(T::w4_dot(w, av, cv)), T::mul(as, ws), acc[0][i]);
    }
  } else if constexpr (T::kW4LaneAct) {
    // Each row's chunk decoded and used at once for every token, whose lane vectors were built
    // once per call (Fp4Act::lane_*): few live registers besides the NT · NR accumulators. Holding
    // the NR decoded rows and building each token's vectors here spilled the accumulators on AVX2
    // (16 registers): Zen 3, one core, K = 2048, ns per token, row and 64-chunk 1.88 → 1.53 at 2
    // tokens, 1.60 → 1.34 at 4, 1.63 → 1.40 at 8 (bench/RESULTS.md 2026-12-06, session 42).
    const int c = (k >> 6) * T::kLanes;
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      const typename T::W4 w = w4_chunk<T, kFull, kW6>(rows[r0 + i], k, K);
      const F ws = T::template w4_weight_scales<kMx, kFull, kBits>(wf[r0 + i], b, nb);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t)
        acc[t][i] = T::fmadd(T::cvt_i32(T::w4_dot(w, T::w4_act(act[t].v + k), T::w4_lane_corr(act[t].lane_corr + c))),
                             T::mul(T::loadu(act[t].lane_scale + c), ws), acc[t][i]);
    }
  } else {
    typename T::W4 w[NR];
    F ws[NR];
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      w[i] = w4_chunk<T, kFull, kW6>(rows[r0 + i], k, K);
      ws[i] = T::template w4_weight_scales<kMx, kFull, kBits>(wf[r0 + i], b, nb);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const typename T::W4A av = T::w4_act(act[t].v + k);
      const F as = T::template w4_lane_scales<kMx>(act[t].scale + b);
      const typename T::I cv = T::w4_corr(act[t].corr + (k >> 2));
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) acc[t][i] = T::fmadd(T::cvt_i32(T::w4_dot(w[i], av, cv)), T::mul(as, ws[i]), acc[t][i]);
    }
  }
}

// Rows r0 .. r0 + NR of a block; res[t][r0 + i]. kBits: the block's MX scale bytes are all 1…254
// (T::w4_weight_scales).
template <class T, bool kMx, int NT, int NR, bool kBits, bool kW6>
void w4_kernel(const uint8_t* const* rows, const typename T::template W4Factors<kMx>* wf, int r0, const Fp4Act* act, int K, int64_t pf_dist,
               float (*res)[kW4Block]) {
  typename T::F acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < NR; ++i) acc[t][i] = T::zero();
  const int kfull = K & ~63;
  int k = 0;
  for (; k < kfull; k += 64) {
    // The next row block in address order (prefetch_seq), every chunk and token group: on AVX2,
    // one line per row every two chunks had the one-token GEMM at half speed from DRAM (Zen 4,
    // one core, K = 2048, N = 1536: 184–215 → 100–102 µs; bench/RESULTS.md 2026-12-06, session 39).
    for (int i = 0; i < NR; ++i) prefetch_seq(rows[r0], pf_dist, k >> 6, i, NR, kW6 ? 48 : 32);
    w4_step<T, kMx, NT, NR, true, kBits, kW6>(rows, wf, r0, act, k, K, acc);
  }
  if (k < K) w4_step<T, kMx, NT, NR, false, kBits, kW6>(rows, wf, r0, act, k, K, acc);
  for (int t = 0; t < NT; ++t) T::hsum_rows(acc[t], res[t] + r0);
}

template <class T, bool kMx, int NT, bool kBits, bool kW6>
void w4_block(const uint8_t* const* rows, const typename T::template W4Factors<kMx>* wf, const Fp4Act* act, int K, int64_t pf_dist,
              float (*res)[kW4Block]) {
  constexpr int NR = T::template kW4Rows<NT>;
  for (int r0 = 0; r0 < kW4Block; r0 += NR) w4_kernel<T, kMx, NT, NR, kBits, kW6>(rows, wf, r0, act, K, pf_dist, res);
}
template <class T, bool kMx, bool kBits, bool kW6>
void w4_block_nt(int nt, const uint8_t* const* rows, const typename T::template W4Factors<kMx>* wf, const Fp4Act* act, int K,
                 int64_t pf_dist, float (*res)[kW4Block]) {
  switch (nt) {
    case 1: w4_block<T, kMx, 1, kBits, kW6>(rows, wf, act, K, pf_dist, res); break;
    case 2: w4_block<T, kMx, 2, kBits, kW6>(rows, wf, act, K, pf_dist, res); break;
    case 3: w4_block<T, kMx, 3, kBits, kW6>(rows, wf, act, K, pf_dist, res); break;
    default: w4_block<T, kMx, 4, kBits, kW6>(rows, wf, act, K, pf_dist, res); break;
  }
}

// Output rows [row0, a.row1) for every token, through the row-major kernel. kW6: MXFP6 E2M3 weights
// (T::w6_weights) on the MX kind.
template <class T, bool kMx, bool kW6 = false>
void gemm_w4a4_rows(const GemmArgs& a, int row0) {
  constexpr int kNT = T::kNT;
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  const int nb = K / (kMx ? 32 : 16);
  const int ld = (nb + 16 + 15) / 16 * 16;
  float* factors = static_cast<float*>(thread_scratch_buffer(1, sizeof(float) * kW4Block * static_cast<size_t>(ld)));
  const int64_t pf_dist = prefetch_distance(kW4Block * w.row_bytes);
  // T::kW4LaneAct: every token's lane vectors once per call (read by the groups of 2+ tokens).
  const int64_t lane_ld = static_cast<int64_t>((K + 63) / 64) * T::kLanes;
  float* lane_scale = nullptr;
  int32_t* lane_corr = nullptr;
  if constexpr (T::kW4LaneAct) {
    if (a.ntok > 1) {
      lane_scale = static_cast<float*>(thread_scratch_buffer(0, sizeof(float) * 2 * static_cast<size_t>(lane_ld * a.ntok)));
      lane_corr = reinterpret_cast<int32_t*>(lane_scale + lane_ld * a.ntok);
      for (int t = 0; t < a.ntok; ++t) {
        const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[t]) * l.stride;
        T::template w4_lane_act<kMx>(reinterpret_cast<const float*>(row + l.scales_off), reinterpret_cast<const int32_t*>(row + l.corr_off), K,
                                     lane_scale + t * lane_ld, lane_corr + t * lane_ld);
      }
    }
  }
  for (int n0 = row0; n0 < a.row1; n0 += kW4Block) {
    const int nr = a.row1 - n0 < kW4Block ? a.row1 - n0 : kW4Block;
    const uint8_t* rows[kW4Block];
    typename T::template W4Factors<kMx> wf[kW4Block];
    for (int i = 0; i < kW4Block; ++i) {  // rows past nr repeat the last one
      const int n = n0 + (i < nr ? i : nr - 1);
      rows[i] = w.data + static_cast<int64_t>(n) * w.row_bytes;
      wf[i] = i < nr ? T::template w4_row_factors<kMx>(w.scales + static_cast<int64_t>(n) * nb, nb, w.nv_global, factors + i * ld)
                     : wf[nr - 1];
    }
    // The block's E8M0 bytes all 1…254: factors built from their bits (T::w4_weight_scales).
    [[maybe_unused]] bool bits = false;
    if constexpr (kMx && T::kW4ScaleBits)
      bits = T::w4_scale_bytes_normal(w.scales + static_cast<int64_t>(n0) * nb, static_cast<int64_t>(nr) * nb);
    for (int j0 = 0, nt = 0; j0 < a.ntok; j0 += nt) {
      nt = token_group<T>(a.ntok, j0);
      Fp4Act act[kNT];
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j0 + t]) * l.stride;
        act[t] = {reinterpret_cast<const int8_t*>(row + l.vals_off), reinterpret_cast<const float*>(row + l.scales_off),
                  reinterpret_cast<const int32_t*>(row + l.corr_off)};
        if (lane_scale != nullptr) {
          act[t].lane_scale = lane_scale + (j0 + t) * lane_ld;
          act[t].lane_corr = lane_corr + (j0 + t) * lane_ld;
        }
      }
      float res[kNT][kW4Block];
      if constexpr (kMx && T::kW4ScaleBits) {
        if (bits) w4_block_nt<T, kMx, true, kW6>(nt, rows, wf, act, K, pf_dist, res);
        else w4_block_nt<T, kMx, false, kW6>(nt, rows, wf, act, K, pf_dist, res);
      } else {
        w4_block_nt<T, kMx, false, kW6>(nt, rows, wf, act, K, pf_dist, res);
      }
      epilogue(a, n0, nr, j0, nt, res);
    }
  }
}

template <class T, bool kMx>
void gemm_w4a4(const GemmArgs& a) {
  gemm_w4a4_rows<T, kMx>(a, a.row0);
}

// A target's GEMM entry point (KernelTable::gemm).
template <class T>
void gemm(const GemmArgs& a) {
  switch (a.layout->kind) {
    case DotKind::F32: gemm_f32<T>(a); break;
    case DotKind::I8: gemm_i8<T>(a); break;
    case DotKind::Fp4Mx:
      // MXFP6 E2M3 weights (W6A6): the row-major kernel with T::w6_weights where the target has it
      // (dot_kind_for selects the kind only there).
      if (a.w->fmt == WeightFormat::Mxfp6E2M3) {
        if constexpr (T::kW6Int) gemm_w4a4_rows<T, true, true>(a, a.row0);
        else scalar_kernels().gemm(a);
      } else {
        gemm_w4a4<T, true>(a);
      }
      break;
    case DotKind::Fp4Nv: gemm_w4a4<T, false>(a); break;
    case DotKind::Bf16:
      if constexpr (T::kBf16Dot) gemm_bf16<T>(a);
      else scalar_kernels().gemm(a);  // not selected on this target (dot_kind_for)
      break;
  }
}

}  // namespace
}  // namespace qmoe::cpu
