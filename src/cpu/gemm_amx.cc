// The AMX target's GEMM translation unit (compiled with the AVX-512 flags and -mamx-tile/bf16/int8):
// tasks whose expert has enough tokens (kAmx*MinTokens) run on AMX tiles; every other task, and the
// other dot kinds, run avx512bf16's kernels (gemm_avx512).
//   Bf16 : TDPBF16PS. Weight rows are decoded exactly to bf16 by the avx512bf16 decoders
//          (simd/bf16_avx512.h: MX block scales in the exponent, FP8 magnitudes by table) into a
//          per-thread panel of 32 rows; bf16 weights are read in place. Each product of two bf16
//          values is exact in fp32 and the tile adds them in fp32 (subnormals flushed, like
//          vdpbf16ps): the Bf16 kind's error, an fp32 sum. Activation terms (ActLayout: up to 3 bf16
//          rows summing exactly to the fp32 value) all accumulate into the same tiles.
//   I8   : TDPBSSD. int8 weight rows read in place (a zero-padded copy at the matrix's edges), int8
//          activation codes; exact int32 sums, signed × signed (no unsigned offset as vpdpbusd).
// Tiles: C0..C3 = 2 × 2 blocks of 16 weight rows × 16 tokens (fp32 / int32), A0, A1 = 16 weight
// rows × 64 bytes of K each (32 bf16 / 64 int8), B0, B1 = 16 tokens' K in the pair (bf16) or quad
// (int8) interleaved layout the instructions take: B row r holds, per token, K elements 2r, 2r + 1
// (4r .. 4r + 3) as one dword. The activations are packed into that layout once per task (a
// 16 × 16 dword transpose per 16 tokens and 64 bytes of K), so the weights, read once per token
// group pair, stay row-major as decoded.
// Linux grants tile data per process (isa.cc asks); the tile configuration is loaded at the start of
// each AMX task and released at its end, so nothing else in the thread sees our tiles.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "cpu/simd/avx512.h"
#include "cpu/simd/gemm.h"
#include "cpu/simd/bf16_avx512.h"

namespace qmoe::cpu {

namespace {

// Tokens of one expert from which a task takes the tiles (below: avx512bf16's row-major kernels,
// which use each decoded weight for every token in registers). One core, K = 2048, N = 1536,
// weights cold, µs AMX / avx512bf16: bf16 weights 2 tokens 451 / 724, 8 tokens 571 / 1727; MXFP4
// weights and activations 2 tokens 321 / 234, 4 tokens 332 / 369, 8 tokens 346 / 726; INT8 (with
// the prefetch sweep) 2 tokens 260, 242 / 237, 243, 4 tokens 249, 250 / 269, 348, 6 tokens 254,
// 248 / 295, 375 (bench/RESULTS.md, 2026-12-05).
constexpr int kAmxBf16MinTokens = 4;
constexpr int kAmxI8MinTokens = 4;
constexpr int kPanelRows = 32;  // weight rows per panel: two A tiles

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Eight tiles of 16 rows × 64 bytes (see the roles above), for the life of one task.
class TileScope {
 public:
  TileScope() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// r[i] (16 dwords each) → r[j] holding dword j of every former r[i], i.e. the 16 × 16 transpose.
inline void transpose16_epi32(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4q + c], lane L: rows 4q..4q+3 of column c + 4L.
  for (int q = 0; q < 4; ++q) {
    u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  // Column c + 4L = lanes L of u[c], u[4 + c], u[8 + c], u[12 + c]: a 4 × 4 transpose of lanes.
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), x3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    r[c + 4] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    r[c + 8] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    r[c + 12] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
}

// Packs nsrc rows of 64-byte blocks into B tiles: for token group g (16 tokens) and 64-byte block
// b, dst[((g · nsets + s) · nblk + b) · 256 + 16 r + m] = dword r of block b of src(s, g·16 + m)
// (zero for m beyond ntok or a null source). src(s, j): the bytes of token j's set s (a term row),
// or null.
template <class Src>
void pack_b(int ntok, int nsets, int nblk, Src src, uint32_t* dst) {
  const int ngroups = (ntok + 15) / 16;
  for (int g = 0; g < ngroups; ++g)
    for (int s = 0; s < nsets; ++s) {
      const uint8_t* rows[16];
      for (int m = 0; m < 16; ++m) rows[m] = g * 16 + m < ntok ? src(s, g * 16 + m) : nullptr;
      uint32_t* out = dst + (static_cast<int64_t>(g) * nsets + s) * nblk * 256;
      for (int b = 0; b < nblk; ++b) {
        __m512i r[16];
        for (int m = 0; m < 16; ++m) r[m] = rows[m] ? _mm512_loadu_si512(rows[m] + 64 * b) : _mm512_setzero_si512();
        transpose16_epi32(r);
        for (int q = 0; q < 16; ++q) _mm512_store_si512(out + 256 * b + 16 * q, r[q]);
      }
    }
}

// Tile C += A · B, bf16 (TDPBF16PS) or int8 (TDPBSSD). A macro: GCC's tile intrinsics paste their
// tile numbers into inline assembly, so they take literal tokens, not template parameters.
#define QMOE_TILE_DOT(kBf16, C, A, B) \
  do {                                \
    if constexpr (kBf16)              \
      _tile_dpbf16ps(C, A, B);        \
    else                              \
      _tile_dpbssd(C, A, B);          \
  } while (0)

// The C tiles of a group pair (stored [weight row][token]: fp32 sums, or exact int32 ones) →
// dot[t][i] (token t, weight row i), then the epilogue.
template <bool kBf16>
void emit_tiles(const GemmArgs& a, int n0, int nr, int j0, int nt, const void* cbuf) {
  using Sum = std::conditional_t<kBf16, float, int32_t>;
  using Dot = std::conditional_t<kBf16, float, double>;
  // [row][token] → [token][row] by 16 × 16 dword transposes (an element loop was ~13 % of a
  // 16-token decoded GEMM's time).
  const auto* c = static_cast<const uint32_t(*)[32]>(cbuf);
  alignas(64) uint32_t tr[32][kPanelRows];
  for (int tb = 0; tb * 16 < nt; ++tb)
    for (int ib = 0; ib < kPanelRows / 16; ++ib) {
      __m512i r[16];
      for (int m = 0; m < 16; ++m) r[m] = _mm512_load_si512(&c[16 * ib + m][16 * tb]);
      transpose16_epi32(r);
      for (int q = 0; q < 16; ++q) _mm512_store_si512(&tr[16 * tb + q][16 * ib], r[q]);
    }
  Dot dot[32][kPanelRows];
  for (int t = 0; t < nt; ++t)
    for (int i = 0; i < kPanelRows; ++i) {
      Sum v;
      std::memcpy(&v, &tr[t][i], sizeof v);
      dot[t][i] = static_cast<Dot>(v);
    }
  epilogue(a, n0, nr, j0, nt, dot);
}

// One panel of 32 weight rows (A at a, row stride lda bytes) against every token group: nblk
// steps of 64 bytes of K, nsets activation sets (terms) accumulated into the same tiles.
// Weights read in place are not prefetched by software: a sweep of the next panel (32 lines a
// step) measured slower than the hardware prefetchers alone (one core, K = 2048, N = 1536, µs
// sweep / none: bf16 weights 16 tokens 491–499 / 435–455 from DRAM, 250 / 241 from L3; INT8
// 4–16 tokens 253–270 / 236–247 from DRAM; bench/RESULTS.md 2026-12-06).
// prep(b0, b1): fills blocks [b0, b1) of A (a decoded panel) just before the first group pair
// uses them, a chunk of blocks at a time, so a decoded chunk (32 rows × 256 or 512 bf16 = 16 or
// 32 KB) is still in L1 when the tiles load it. kRing > 0: with one pass (≤ 32 tokens) A is a ring
// of kRing blocks (block b at A + 64 · (b mod kRing)) that every chunk of kRing blocks overwrites,
// so the decoder's stores and the tile loads stay in L1 (a whole decoded panel, 32 rows × K, is
// 64–180 KB: past L1, the stores missed and the tiles loaded from L2); kRing = 0: A holds the whole
// panel, filled kPrepBlocks at a time.
constexpr int kPrepBlocks = 8;  // blocks per prep call without the ring (a whole decoded panel)
// Blocks per ring chunk (a power of two: the ring's index mask), per decoder. Each chunk sets up a
// decoder per row, a fixed cost per row and chunk that 16 blocks halve; MXFP4's decoder measured
// faster with 8 (one core, K = 2048, N = 1536, cold, µs 8 → 16 blocks: 4 / 16 / 32 tokens FP8
// 463–475 → 405–406 / 476 → 423 / 516–518 → 489–510; MXFP6 e2m3 486–501 → 416–427 / 503–595 →
// 432–444 / 543–559 → 489–501; NVFP4 (16 tokens) 446–457 → 391–394; MXFP4 304–308 → 316–326 /
// 311–314 → 325–336 / 364–390 → 387–398; bench/RESULTS.md 2026-12-06).
template <class D>
constexpr int ring_blocks() {
  return std::is_same_v<D, BDecMxfp4> ? 8 : 16;
}
struct NoPrep {
  void operator()(int, int) const {}
};

// next / next_bytes: weights read in place whose next panel the first pass prefetches into L2, a
// share per block (amx_i8, short rows).
template <bool kBf16, class Prep = NoPrep, int kRing = 0>
void panel_tiles(const GemmArgs& a, int n0, int nr, const uint8_t* A, int64_t lda, const uint32_t* pk, int nsets, int nblk,
                 Prep prep = {}, const uint8_t* next = nullptr, int64_t next_bytes = 0) {
  static_assert(kRing >= 0 && (kRing & (kRing - 1)) == 0);
  constexpr int kChunk = kRing > 0 ? kRing : kPrepBlocks;
  constexpr int kWrap = kRing > 0 ? kRing - 1 : -1;  // the block index mask
  const int ngroups = (a.ntok + 15) / 16;
  alignas(64) uint32_t cbuf[kPanelRows][32];  // fp32 or int32 sums
  for (int g0 = 0; g0 < ngroups; g0 += 2) {
    const bool two = g0 + 1 < ngroups;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int b = 0; b < nblk; ++b) {
      if constexpr (!std::is_same_v<Prep, NoPrep>)
        if (g0 == 0 && b % kChunk == 0) prep(b, b + kChunk < nblk ? b + kChunk : nblk);
      if (next != nullptr && g0 == 0)
        for (int64_t off = next_bytes * b / nblk / 64 * 64; off < next_bytes * (b + 1) / nblk; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T1);
      const uint8_t* Ab = A + 64 * (b & kWrap);
      _tile_loadd(4, Ab, lda);
      _tile_loadd(5, Ab + 16 * lda, lda);
      for (int s = 0; s < nsets; ++s) {
        const uint32_t* b0 = pk + ((static_cast<int64_t>(g0) * nsets + s) * nblk + b) * 256;
        _tile_loadd(6, b0, 64);
        QMOE_TILE_DOT(kBf16, 0, 4, 6);
        QMOE_TILE_DOT(kBf16, 2, 5, 6);
        if (two) {
          _tile_loadd(7, b0 + static_cast<int64_t>(nsets) * nblk * 256, 64);
          QMOE_TILE_DOT(kBf16, 1, 4, 7);
          QMOE_TILE_DOT(kBf16, 3, 5, 7);
        }
      }
    }
    _tile_stored(0, &cbuf[0][0], 128);
    _tile_stored(1, &cbuf[0][16], 128);
    _tile_stored(2, &cbuf[16][0], 128);
    _tile_stored(3, &cbuf[16][16], 128);
    const int j0 = g0 * 16;
    emit_tiles<kBf16>(a, n0, nr, j0, a.ntok - j0 < 32 ? a.ntok - j0 : 32, cbuf);
  }
}
#undef QMOE_TILE_DOT

// Row stride of a copied / decoded panel of nblk 64-byte blocks: one line more than a multiple of
// 4 KiB would be (the 32 rows on different L1 sets).
inline int64_t panel_stride(int nblk) { return static_cast<int64_t>(nblk) * 64 + ((nblk * 64) % 4096 == 0 ? 64 : 0); }

// Rows shorter than this (bytes) read in place get the next panel prefetched: the hardware
// prefetchers follow 32 long rows read 64 bytes at a time, not short ones. INT8, one core, N = 2048,
// 8 tokens, from DRAM, µs without / with (p10): K = 512 94 / 85, 768 143–149 / 127–131 (medians
// 233–245 / 129–133), 1024 175 / 174, 1408 209 / 234, 2048 226–299 / 330–441 (bench/RESULTS.md
// 2026-12-06, session 36).
constexpr int64_t kPrefetchRowBytes = 1024;

// Weights read in place: the panel at row n0 when it lies inside the matrix (else null: the edge
// goes through a copy).
// Only while each panel meets at most one token-group pair (one pass): with more, a padded copy
// (4 KiB row strides put a tile's 16 rows on one L1 set, and every further pass re-reads the
// panel: 750 against 1030 GFLOP/s for decoded MXFP4 at 256 tokens, one core, hot).
inline const uint8_t* in_place_panel(const GemmArgs& a, int n0) {
  const WeightView& w = *a.w;
  if (n0 + kPanelRows > w.rows) return nullptr;
  return w.data + static_cast<int64_t>(n0) * w.row_bytes;
}

// ---------------------------------------------------------------------------------------------
// Bf16 on TDPBF16PS.
template <class Make>
void amx_bf16(const GemmArgs& a, Make make_dec, int scale_cols, int smin, int smax) {
  using D = decltype(make_dec(static_cast<const int*>(nullptr)));
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  constexpr int kRing = ring_blocks<D>();
  static_assert(D::kStep % 32 == 0 && (32 * kPrepBlocks) % D::kStep == 0 && (32 * kRing) % D::kStep == 0);
  const int kend = (K + D::kStep - 1) / D::kStep * D::kStep;  // ≤ k_pad; decoders zero-fill past K
  const int nblk = kend / 32;                                 // 64-byte steps (32 bf16)
  const auto act_row = [&](int j) { return a.act_base + static_cast<int64_t>(a.act_index[j]) * l.stride; };
  int nterm = 1;
  for (int j = 0; j < a.ntok; ++j) nterm = std::max(nterm, bf16_term_count(act_row(j)));
  const int ngroups = (a.ntok + 15) / 16;
  auto* pk = static_cast<uint32_t*>(thread_scratch_buffer(2, static_cast<size_t>(ngroups) * nterm * nblk * 1024));
  pack_b(a.ntok, nterm, nblk,
         [&](int s, int j) -> const uint8_t* { return s < bf16_term_count(act_row(j)) ? act_row(j) + l.vals_off + s * l.term_bytes : nullptr; },
         pk);
  // One pass over each panel (≤ 2 token groups): the decoded blocks go through a ring of kRing
  // blocks; more passes re-read the whole decoded panel.
  const bool ring = ngroups <= 2;
  const int64_t ldp = panel_stride(ring ? kRing : nblk);
  // MXFP4 through the ring: the panel's exponent deltas (BDecMxfp4::row_deltas, one dword per row
  // and step) behind the ring.
  constexpr bool kMx4 = std::is_same_v<D, BDecMxfp4>;
  const bool mx4_fill = kMx4 && ring;
  const int nsteps = kMx4 ? BDecMxfp4::delta_dwords(K) : 0;
  auto* panel = static_cast<uint8_t*>(
      thread_scratch_buffer(3, static_cast<size_t>(kPanelRows * ldp) + (mx4_fill ? 4u * kPanelRows * nsteps : 0u)));
  auto* deltas = reinterpret_cast<uint32_t*>(panel + kPanelRows * ldp);
  const bool in_place = w.fmt == WeightFormat::BF16 && K % 32 == 0 && ring;
  TileScope tiles;
  for (int n0 = a.row0; n0 < a.row1; n0 += kPanelRows) {
    const int nr = a.row1 - n0 < kPanelRows ? a.row1 - n0 : kPanelRows;
    if (const uint8_t* A = in_place ? in_place_panel(a, n0) : nullptr) {
      panel_tiles<true>(a, n0, nr, A, w.row_bytes, pk, nterm, nblk);
      continue;
    }
    // The panel's 8 groups of 4 rows (rows past nr repeat the last one), their scales checked.
    // With one pass (ring): a decoder per row and chunk, its row in slot 0 (load(0, ·) keeps the
    // row's pointers in registers, not in an indexed array), and the next panel's codes (32
    // contiguous rows) swept into L2 in address order, a share per chunk (prep_ring). With
    // several passes: the groups' decoders and each row's stream prefetched ahead (the per-row
    // form measured 2–8 % slower there).
    D dec[kPanelRows / kNR];
    Prefetch<kNR> pf[kPanelRows / kNR];
    int rows0[kNR];
    for (int& i : rows0) i = n0;
    const D proto = make_dec(rows0);  // the format's tables (MXFP4's fill)
    bool exact = true;
    for (int g = 0; g < kPanelRows / kNR; ++g) {
      int rows[kNR];
      for (int i = 0; i < kNR; ++i) rows[i] = n0 + (g * kNR + i < nr ? g * kNR + i : nr - 1);
      if (scale_cols > 0 && !scales_in_window(row_set<kNR>(w, rows, scale_cols), scale_cols, smin, smax)) exact = false;
      if (!ring) {
        dec[g] = make_dec(rows);
        pf[g] = prefetch_of<kNR>(w, rows[0]);
      }
    }
    if (!exact) {  // rare: extreme / NaN block scales, exactly in the avx512bf16 kernels (→ scalar; no tiles)
      GemmArgs sub = a;
      sub.row0 = n0;
      sub.row1 = n0 + nr;
      gemm_avx512(sub);
      continue;
    }
    const int next_rows = n0 + kPanelRows < a.row1 ? std::min(kPanelRows, a.row1 - n0 - kPanelRows) : 0;
    const uint8_t* next_codes = w.data + static_cast<int64_t>(n0 + kPanelRows) * w.row_bytes;
    const int64_t next_bytes = static_cast<int64_t>(next_rows) * w.row_bytes;
    // Two fill functions, not one with a compile-time switch: the merged form measured MXFP6's ring
    // 15 % slower (hot, 16 tokens, K = N = 1024: 131–143 → 152–158 µs; cause not established).
    // The next panel's share is prefetched a few lines per decoded row, not in one burst: each
    // software prefetch holds a fill buffer until its line arrives, so a burst of 64–128 stalled
    // the decoder's own loads behind it (one core, K = 2048, N = 1536, 8 tokens, µs burst →
    // spread: FP8 593 → 479 from DRAM, 455 → 308 from L3; MXFP4 457 → 305; bench/RESULTS.md
    // 2026-12-06).
    auto prep_ring = [&](int b0, int b1) {  // (kend = 32 · nblk: whole decoder steps, no tail)
      const int64_t s0 = next_bytes * b0 / nblk / 64 * 64, s1 = next_bytes * b1 / nblk;
      const int64_t per_row = ((s1 - s0) / 64 + kPanelRows - 1) / kPanelRows * 64;
      for (int r = 0; r < kPanelRows; ++r) {
        for (int64_t off = s0 + r * per_row; off < s1 && off < s0 + (r + 1) * per_row; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next_codes + off), _MM_HINT_T1);
        int one[kNR];
        for (int& i : one) i = n0 + (r < nr ? r : nr - 1);
        const D d = make_dec(one);
        uint8_t* dst = panel + r * ldp;  // the ring holds blocks b0 .. b1 - 1 from its start
        for (int k = 32 * b0; k < 32 * b1; k += D::kStep) {
          __m512i wv[D::kStep / 32];
          d.load(0, k, wv);
          for (int v = 0; v < D::kStep / 32; ++v) _mm512_store_si512(dst + 2 * (k - 32 * b0 + 32 * v), wv[v]);
        }
      }
    };
    auto prep_panel = [&](int b0, int b1) {
      for (int r = 0; r < kPanelRows; ++r) {
        const D& d = dec[r / kNR];
        const int i = r % kNR;
        uint8_t* dst = panel + r * ldp;
        for (int k = 32 * b0; k < 32 * b1; k += D::kStep) {
          pf[r / kNR].template at<D>(i, k);
          __m512i wv[D::kStep / 32];
          d.load(i, k, wv);
          for (int v = 0; v < D::kStep / 32; ++v) _mm512_store_si512(dst + 2 * (k + 32 * v), wv[v]);
        }
      }
    };
    // MXFP4's fill without a decoder per row and chunk: the deltas of the panel's rows once (at its
    // first chunk), then per row a pointer and the chunk's steps (BDecMxfp4::raised_words). One
    // core, K = 2048, N = 1536, hot, µs per-row-and-chunk decoders → this: 8 / 16 / 32 tokens
    // 225–236 → 176–190 / 240 → 194–207 / 304 → 233–256 (bench/RESULTS.md 2026-12-06, session 36).
    auto prep_mx4 = [&](int b0, int b1) {
      if constexpr (kMx4) {
        if (b0 == 0)
          for (int r = 0; r < kPanelRows; ++r)
            BDecMxfp4::row_deltas(w.scales + static_cast<int64_t>(n0 + (r < nr ? r : nr - 1)) * (K / 32), K / 32, deltas + r * nsteps);
        const int64_t s0 = next_bytes * b0 / nblk / 64 * 64, s1 = next_bytes * b1 / nblk;
        const int64_t per_row = ((s1 - s0) / 64 + kPanelRows - 1) / kPanelRows * 64;
        const int full = (std::min(32 * b1, K / 64 * 64) - 32 * b0) / 64;  // whole steps of the chunk
        for (int r = 0; r < kPanelRows; ++r) {
          for (int64_t off = s0 + r * per_row; off < s1 && off < s0 + (r + 1) * per_row; off += 64)
            _mm_prefetch(reinterpret_cast<const char*>(next_codes + off), _MM_HINT_T1);
          const uint8_t* row = w.data + static_cast<int64_t>(n0 + (r < nr ? r : nr - 1)) * w.row_bytes;
          const uint32_t* dd = deltas + r * nsteps;
          uint8_t* dst = panel + r * ldp;  // the ring holds blocks b0 .. b1 - 1 from its start
          const __m512i ibase = proto.ibase;  // (in registers: the stores below may alias proto)
          const __mmask32 inz = proto.inz;
          auto step = [&](int j, __m512i x) __attribute__((always_inline)) {  // elements 32 · b0 + 64 · j …
            __m512i wv[2];
            D::raised_words(x, dd[b0 / 2 + j], ibase, inz, wv);
            _mm512_store_si512(dst + 128 * j, wv[0]);
            _mm512_store_si512(dst + 128 * j + 64, wv[1]);
          };
          const uint8_t* src = row + 16 * b0;
          int j = 0;
          for (; j < full; ++j) step(j, _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * j))));
          if (j < (b1 - b0) / 2) step(j, fp4_step_bytes(row, 32 * b0 + 64 * j, K));  // K % 64 == 32: the last, half step
        }
      }
    };
    if (mx4_fill)
      panel_tiles<true, decltype(prep_mx4), kRing>(a, n0, nr, panel, ldp, pk, nterm, nblk, prep_mx4);
    else if (ring)
      panel_tiles<true, decltype(prep_ring), kRing>(a, n0, nr, panel, ldp, pk, nterm, nblk, prep_ring);
    else
      panel_tiles<true>(a, n0, nr, panel, ldp, pk, nterm, nblk, prep_panel);
  }
}

// ---------------------------------------------------------------------------------------------
// I8 on TDPBSSD.
void amx_i8(const GemmArgs& a) {
  const ActLayout& l = *a.layout;
  const WeightView& w = *a.w;
  const int K = w.cols;
  const int nblk = (K + 63) / 64;  // ≤ k_pad / 64 (codes zero padded)
  const int ngroups = (a.ntok + 15) / 16;
  auto* pk = static_cast<uint32_t*>(thread_scratch_buffer(2, static_cast<size_t>(ngroups) * nblk * 1024));
  pack_b(a.ntok, 1, nblk,
         [&](int, int j) -> const uint8_t* { return a.act_base + static_cast<int64_t>(a.act_index[j]) * l.stride + l.vals_off; }, pk);
  const int64_t ldp = panel_stride(nblk);
  uint8_t* panel = nullptr;
  const bool in_place = K % 64 == 0 && ngroups <= 2;
  TileScope tiles;
  for (int n0 = a.row0; n0 < a.row1; n0 += kPanelRows) {
    const int nr = a.row1 - n0 < kPanelRows ? a.row1 - n0 : kPanelRows;
    if (const uint8_t* A = in_place ? in_place_panel(a, n0) : nullptr) {
      const int next_rows = w.row_bytes < kPrefetchRowBytes ? std::min(kPanelRows, std::max(0, a.row1 - n0 - kPanelRows)) : 0;
      panel_tiles<false>(a, n0, nr, A, w.row_bytes, pk, 1, nblk, NoPrep{}, next_rows > 0 ? A + kPanelRows * w.row_bytes : nullptr,
                         static_cast<int64_t>(next_rows) * w.row_bytes);
      continue;
    }
    // Edges: a zero-padded copy (rows past nr repeat the last one).
    if (panel == nullptr) panel = static_cast<uint8_t*>(thread_scratch_buffer(3, static_cast<size_t>(kPanelRows * ldp)));
    for (int i = 0; i < kPanelRows; ++i) {
      const uint8_t* src = w.data + static_cast<int64_t>(n0 + (i < nr ? i : nr - 1)) * w.row_bytes;
      uint8_t* dst = panel + i * ldp;
      for (int b = 0; b < nblk; ++b)
        _mm512_store_si512(dst + 64 * b, _mm512_maskz_loadu_epi8(mask64(K - 64 * b), src + 64 * b));
    }
    panel_tiles<false>(a, n0, nr, panel, ldp, pk, 1, nblk);
  }
}

}  // namespace

void gemm_amx(const GemmArgs& a) {
  if (a.layout->kind == DotKind::I8 && a.w->fmt == WeightFormat::Int8 && a.ntok >= kAmxI8MinTokens) {
    amx_i8(a);
    return;
  }
  if (a.layout->kind == DotKind::Bf16 && a.ntok >= kAmxBf16MinTokens) {
    WeightView tmp;
    const GemmArgs b = bf16_args(a, tmp);
    const bool ok = with_bf16_decoder(*b.w, [&](auto make_dec, int scale_cols, int smin, int smax) {
      amx_bf16(b, make_dec, scale_cols, smin, smax);
    });
    if (ok) return;
  }
  gemm_avx512(a);
}

}  // namespace qmoe::cpu
