// The AVX-512 target's GEMM translation unit (compiled with -mavx512f/bw/vl/dq/vnni/bf16): the
// generic kernels of simd/gemm.h instantiated on the AVX-512 ISA layer (simd/avx512.h), plus the
// AVX-512-only kernels:
//   Bf16          : vdpbf16ps on exactly decoded bf16 weights (avx512bf16 target only, below);
//   Fp4Mx / Fp4Nv : W4A4 vpdpbusd kernels, gemm_fp4_avx512.cc;
//   MXFP4 weights on the F32 kind: the one-token row stream, gemm_fp4_avx512.cc.
#include "cpu/simd/avx512.h"
#include "cpu/simd/gemm.h"
#include "cpu/simd/bf16_avx512.h"

namespace qmoe::cpu {

namespace {

// NTOK activation rows (tokens of NTERM terms each: the bf16 pieces that sum to their fp32 values;
// act[t·NTERM + j] is token t's term j) against kNR weight rows, res[t][i]:
//  * block-factor decoders (D::load_unscaled, D::factor; MX codes through the fixed table): a
//    token's products of a step, all its terms, are summed into one vector per row before the
//    block factor — one FMA per step, row and token. NTERM = 2, 3 takes 1–4 tokens of several
//    terms without the decoded-row buffer their 6–12 term rows would need;
//  * decoders whose codes carry the scale (D::load: bf16 weights, FP8, the raised MX tables of the
//    decoded-row buffer): dot products accumulated directly (rows of one term).
template <class D, int NTOK, int NTERM>
void bf16_kernel(const D& dec, const Prefetch<kNR>& pf, const uint16_t* const* act, int kend, float (*res)[kNR]) {
  constexpr int V = D::kStep / 32;
  constexpr bool kFactor = block_factor_of<D>();
  static_assert(kFactor || NTERM == 1, "rows of several terms need a block-factor decoder");
  __m512 acc[NTOK][kNR];
  for (int t = 0; t < NTOK; ++t)
    for (int i = 0; i < kNR; ++i) acc[t][i] = _mm512_setzero_ps();
  if constexpr (NTOK == 1 && !kFactor && D::kBytes > 0 && row_stream_of<D>()) {
    // One token, bf16 and FP8 weights (row_stream_of): one weight row after the
    // other, a single sequential stream (as f32_kernel). One core, cold, K = 2048 / 768: bf16
    // weights 420–424 → 363–365 / 220–224 → 192 µs, FP8 371–376 → 240–251 / 185–187 → 127–130; the
    // block-factor decoders keep the interleaved rows (MXFP6 0.92–0.97× this way; bench/RESULTS.md
    // 2026-12-05 late).
    if (pf.base != nullptr) {
      // U steps per iteration into U · V accumulators: a single vdpbf16ps chain per row (V = 1:
      // bf16 and FP8 weights) waited on the instruction's latency every 32 weights.
      constexpr int U = V >= 4 ? 1 : 4 / V;
      for (int i = 0; i < kNR; ++i) {
        __m512 a[U * V];
        for (int v = 0; v < U * V; ++v) a[v] = _mm512_setzero_ps();
        // One step at k into the accumulators from a + u · V.
        auto step = [&](int k, int u) __attribute__((always_inline)) {
          row_stream_prefetch(dec, i, k, pf.row_dist);
          __m512i w[V];
          dec.load(i, k, w);
#pragma GCC unroll 2
          for (int v = 0; v < V; ++v) a[u * V + v] = dpbf16(a[u * V + v], w[v], _mm512_loadu_si512(act[0] + k + 32 * v));
        };
        int k = 0;
        for (; k + U * D::kStep <= kend; k += U * D::kStep)
#pragma GCC unroll 4
          for (int u = 0; u < U; ++u) step(k + u * D::kStep, u);
        for (; k < kend; k += D::kStep) step(k, 0);
        for (int v = 1; v < U * V; ++v) a[0] = _mm512_add_ps(a[0], a[v]);
        acc[0][i] = a[0];
      }
      _mm_storeu_ps(res[0], hsum4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]));
      return;
    }
  }
  for (int k = 0; k < kend; k += D::kStep) {
    if constexpr (D::kBytes > 0) pf.template block_at<D>(k / D::kStep);
#pragma GCC unroll 4
    for (int i = 0; i < kNR; ++i) {
      __m512i w[V];
      if constexpr (kFactor) {
        dec.load_unscaled(i, k, w);
        const __m512 f = dec.factor(i, k);
#pragma GCC unroll 4
        for (int t = 0; t < NTOK; ++t) {
          __m512 p = _mm512_setzero_ps();
#pragma GCC unroll 3
          for (int j = 0; j < NTERM; ++j)
#pragma GCC unroll 2
            for (int v = 0; v < V; ++v) p = dpbf16(p, w[v], _mm512_loadu_si512(act[t * NTERM + j] + k + 32 * v));
          acc[t][i] = _mm512_fmadd_ps(p, f, acc[t][i]);
        }
      } else {
        dec.load(i, k, w);
#pragma GCC unroll 4
        for (int t = 0; t < NTOK; ++t)
#pragma GCC unroll 2
          for (int v = 0; v < V; ++v) acc[t][i] = dpbf16(acc[t][i], w[v], _mm512_loadu_si512(act[t] + k + 32 * v));
      }
    }
  }
  for (int t = 0; t < NTOK; ++t) _mm_storeu_ps(res[t], hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

// 1–4 activation rows of NTERM terms each (ntok: their count).
template <class D, int NTERM = 1>
void bf16_group(const D& dec, const Prefetch<kNR>& pf, const uint16_t* const* act, int ntok, int kend, float (*res)[kNR]) {
  switch (ntok) {
    case 1: bf16_kernel<D, 1, NTERM>(dec, pf, act, kend, res); break;
    case 2: bf16_kernel<D, 2, NTERM>(dec, pf, act, kend, res); break;
    case 3: bf16_kernel<D, 3, NTERM>(dec, pf, act, kend, res); break;
    default: bf16_kernel<D, 4, NTERM>(dec, pf, act, kend, res); break;
  }
}

// The activation rows of a GEMM as (token, term) pairs: vrow v reads term term_of[v] of token
// tok_of[v]; tokens' vrows are consecutive.
struct VRows {
  const uint16_t** ptr;
  int* tok;
  int n = 0;
};

template <class D, class Make>
void run_bf16(const GemmArgs& a, Make make_dec, int scale_cols, int smin, int smax) {
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  const int kend = (K + D::kStep - 1) / D::kStep * D::kStep;  // ≤ k_pad; decoders zero-fill past K
  if (a.ntok <= 0) return;
  // vrows of every token (per-thread scratch, grown only).
  const size_t cap = static_cast<size_t>(a.ntok) * kBf16Terms;
  auto* vmem = static_cast<uint8_t*>(thread_scratch_buffer(1, cap * (sizeof(const uint16_t*) + sizeof(int)) + 64));
  VRows vr{reinterpret_cast<const uint16_t**>(vmem), reinterpret_cast<int*>(vmem + cap * sizeof(const uint16_t*))};
  for (int j = 0; j < a.ntok; ++j) {
    const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j]) * l.stride;
    const int32_t nt = bf16_term_count(row);
    for (int t = 0; t < nt; ++t) {
      vr.ptr[vr.n] = reinterpret_cast<const uint16_t*>(row + l.vals_off + t * l.term_bytes);
      vr.tok[vr.n++] = j;
    }
  }
  // The term count every token shares when there are ≤ kNT tokens (0: none shared, or more tokens).
  int uniform_terms = a.ntok <= kNT ? vr.n / a.ntok : 0;
  for (int v = 0; v < vr.n && uniform_terms > 0; ++v)
    if (vr.tok[v] != v / uniform_terms) uniform_terms = 0;
  if (uniform_terms * a.ntok != vr.n) uniform_terms = 0;
  for (int n0 = a.row0; n0 < a.row1; n0 += kNR) {
    const int nr = a.row1 - n0 < kNR ? a.row1 - n0 : kNR;
    int rows[kNR];
    for (int i = 0; i < kNR; ++i) rows[i] = n0 + (i < nr ? i : nr - 1);
    const D dec = make_dec(rows);
    if (scale_cols > 0 && !scales_in_window(row_set<kNR>(w, rows, scale_cols), scale_cols, smin, smax)) {
      GemmArgs sub = a;  // rare: extreme / NaN block scales, exactly in the scalar kernel
      sub.row0 = n0;
      sub.row1 = n0 + nr;
      scalar_kernels().gemm(sub);
      continue;
    }
    const Prefetch<kNR> pf = prefetch_of<kNR>(w, n0);
    double dot[kNT][kNR];
    float res[kNT][kNR];
    if constexpr (block_factor_of<D>()) {
      if (uniform_terms >= 2) {  // ≤ kNT tokens of 2 or 3 terms each
        if (uniform_terms == 2) bf16_group<D, 2>(dec, pf, vr.ptr, a.ntok, kend, res);
        else bf16_group<D, 3>(dec, pf, vr.ptr, a.ntok, kend, res);
        for (int j = 0; j < a.ntok; ++j)
          for (int i = 0; i < kNR; ++i) dot[j][i] = static_cast<double>(res[j][i]);
        epilogue(a, n0, nr, 0, a.ntok, dot);
        continue;
      }
    }
    if (vr.n <= kNT) {
      bf16_group(dec, pf, vr.ptr, vr.n, kend, res);
      for (int j = 0; j < a.ntok; ++j)
        for (int i = 0; i < kNR; ++i) dot[j][i] = 0.0;
      for (int v = 0; v < vr.n; ++v)
        for (int i = 0; i < kNR; ++i) dot[vr.tok[v]][i] += static_cast<double>(res[v][i]);
      epilogue(a, n0, nr, 0, a.ntok, dot);
      continue;
    }
    // Many activation rows: decode the 4 rows once into an L1-resident bf16 buffer.
    const int ld = (kend + 31) / 32 * 32;
    uint16_t* buf = static_cast<uint16_t*>(thread_scratch_buffer(0, sizeof(uint16_t) * kNR * static_cast<size_t>(ld)));
    for (int i = 0; i < kNR; ++i)
      for (int k = 0; k < kend; k += D::kStep) {
        pf.template at<D>(i, k);
        __m512i wv[D::kStep / 32];
        dec.load(i, k, wv);
        for (int v = 0; v < D::kStep / 32; ++v) _mm512_storeu_si512(buf + static_cast<int64_t>(i) * ld + k + 32 * v, wv[v]);
      }
    BDecBuf bdec{buf, ld};
    // The next row block into L2 while the first token group reads this one, on top of the decode
    // pass's own sweep (which replaced by it was slower, bench/RESULTS.md 2026-12-06 session 40): Zen 4,
    // 2 threads, bf16 weights, qwen3-30b-a3b T = 64 / 128 1.07x / 1.09x, gpt-oss-20b T = 128 1.04x.
    if (n0 + 2 * kNR <= a.row1)
      bdec.next = SpreadPrefetch::over(w.data + static_cast<int64_t>(n0 + kNR) * w.row_bytes, kNR * w.row_bytes,
                                       kend / BDecBuf::kStep);
    // Token groups of ≤ kNT tokens; their vrows in runs of ≤ kNT.
    int v0 = 0;
    for (int j0 = 0; j0 < a.ntok; j0 += kNT) {
      const int nt = a.ntok - j0 < kNT ? a.ntok - j0 : kNT;
      int v1 = v0;
      while (v1 < vr.n && vr.tok[v1] < j0 + nt) ++v1;
      for (int t = 0; t < nt; ++t)
        for (int i = 0; i < kNR; ++i) dot[t][i] = 0.0;
      for (int v = v0; v < v1; v += kNT) {
        const int nv = v1 - v < kNT ? v1 - v : kNT;
        bf16_group(bdec, Prefetch<kNR>{}, vr.ptr + v, nv, kend, res);
        bdec.next = {};  // the first group's sweep covers the next block
        for (int q = 0; q < nv; ++q)
          for (int i = 0; i < kNR; ++i) dot[vr.tok[v + q] - j0][i] += static_cast<double>(res[q][i]);
      }
      epilogue(a, n0, nr, j0, nt, dot);
      v0 = v1;
    }
  }
}

template <>
void gemm_bf16<Avx512>(const GemmArgs& args) {
  WeightView tmp;
  const GemmArgs a = bf16_args(args, tmp);
  const bool ok = with_bf16_decoder(*a.w, [&](auto make_dec, int scale_cols, int smin, int smax) {
    using D = decltype(make_dec(static_cast<const int*>(nullptr)));
    run_bf16<D>(a, make_dec, scale_cols, smin, smax);
  });
  if (!ok) scalar_kernels().gemm(args);  // not selected by dot_kind_for
}

template <>
void gemm_mxfp4_f32<Avx512>(const GemmArgs& a) {
  gemm_mxfp4_f32_avx512(a);
}

template <>
void gemm_w4a4<Avx512, true>(const GemmArgs& a) {
  gemm_fp4_mx_avx512(a);
}
template <>
void gemm_w4a4<Avx512, false>(const GemmArgs& a) {
  gemm_fp4_nv_avx512(a);
}

}  // namespace

void gemm_avx512(const GemmArgs& a) { gemm<Avx512>(a); }

}  // namespace qmoe::cpu
