// Internal interface between the optimized expert driver (experts_optimized.cc) and the per-ISA
// kernels (kernels_scalar.cc; *_avx2.cc, *_avx512.cc: the generic kernels of simd/*.h on each
// target's ISA layer, simd/<target>.h). Everything here is plain data + function pointers so
// that the ISA translation units (compiled with their own -m flags) share no inline code with the
// baseline ones.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/isa.h"
#include "cpu/ref/ref_ops.h"
#include "qmoe/params.h"
#include "qmoe/schemes.h"
#include "qmoe/tensor.h"

namespace qmoe::cpu {

// The arithmetic of one GEMM (both GEMMs of a scheme use the same kind).
enum class DotKind : uint8_t {
  F32,    // fp32 activation values × weights decoded to fp32 (block scales folded in), fp32 FMA
  I8,     // int8 codes × int8 weights, exact int32 sums (W8A8 INT8)
  Fp4Mx,  // 2·e2m1 × 2·e2m1 integer sums per 32-block × 2^sa · 2^sw (MXFP4 W4A4; MXFP6 E2M3
          // activations as 8·e2m3, W4A6)
  Fp4Nv,  // 2·e2m1 × 2·e2m1 integer sums per 16-block × deq_a · fp8(s_w)·ws2 (NVFP4 W4A4)
  Bf16,   // bf16 weights (stored, or MX decoded exactly with the block scale in the exponent) ·
          // bf16 activation terms (x = Σ terms exactly), vdpbf16ps: products exact, fp32 sums
};

// Layout of one quantized activation row (GEMM input), the same for every ISA:
//   [0, 64)             header: float row_scale at 0 (multiplies the whole dot product: the
//                       fp8 / int8 scale, 0.25 for the Fp4 kinds, 1 otherwise); int32 code sum at 4
//                       (I8: Σ codes, for the unsigned-offset dot product); Bf16: int32 number of
//                       terms in use at 8 (1..3)
//   [64, 64 + vbytes)   k_pad values: F32 → float; I8 → int8 codes; Fp4 → int8 2·e2m1 values
//                       (Fp4Mx of MXFP6 E2M3 activations: 8·e2m3, in [−60, 60]);
//                       Bf16 → kBf16Terms rows of k_pad bf16 (term t at 64 + t·term_bytes): the
//                       fp32 value v (as the F32 kind stores it) split by truncation,
//                       h = v with the low 16 bits cleared, m = the same of v − h, l = v − h − m
//                       (exact: 3 × 8 significant bits hold the 24 of an fp32; NaN → h = NaN,
//                       ±Inf → h = ±Inf, m = l = 0). Rows whose m (and l) are all zero use 1 (2)
//                       terms: bf16 inputs (GEMM1, fp8 / MX-quantized values) need one.
//                       Zero padded from k to k_pad (a multiple of 64).
//   [scales_off, ...)   Fp4 kinds: one float per block (MX 32, NVFP4 16): x = value/2 · scale
//                       (8·e2m3 values: the scale is 2^s / 4);
//                       followed by ≥ 16 zero floats (kernels load 16 at a time).
//   [corr_off, ...)     Fp4 kinds: int32 per 4 stored values, −w_offset · (their sum): the
//                       correction of an unsigned-offset dot product Σ (w_mult·w + w_offset)·v (see
//                       gemm_fp4_avx512.cc).
//   [bcorr_off, ...)    Fp4 kinds: int32 per block, −w_offset · (the block's sum of values).
// Value order: for fp4 weight formats (MXFP4, NVFP4) each 64-element chunk (32-groups g, g+1;
// 32 packed bytes) is stored as [even elements of g | even of g+1 | odd of g | odd of g+1]
// (16 each): the order a packed row decodes in — low nibbles of the 32 bytes, then high nibbles.
// Element e = 64c + 32h + 2m + o sits at 64c + 32o + 16h + m. The Fp4Mx row of MXFP6 E2M3 weights
// (W6A6, AVX2: w6_weights) keeps each 16-element half in order: [g 0–15 | g+1 0–15 | g 16–31 |
// g+1 16–31], element 64c + 32h + 16o + m at 64c + 32o + 16h + m. Every other layout keeps the
// natural order.
inline constexpr int kBf16Terms = 3;
struct ActLayout {
  DotKind kind = DotKind::F32;
  bool fp4_order = false;  // the 32-group even/odd permutation above
  bool fp6_order = false;  // the Fp4Mx row of MXFP6 E2M3 weights: halves of the 32-groups as above
  // Fp4 kinds: the weight side of the integer products, w_mult · w + w_offset (unsigned): 2 · e2m1 + 12
  // (MXFP4, NVFP4), 8 · e2m3 + 60 (MXFP6 E2M3).
  int w_mult = 2, w_offset = 12;
  int k = 0, k_pad = 0;
  int elem_bytes = 4;
  int64_t vals_off = 64;
  int64_t term_bytes = 0;  // Bf16: bytes per term row (2·k_pad)
  int64_t vals_bytes = 0;  // bytes of the value area (all terms)
  int64_t scales_off = 0;
  int64_t corr_off = 0;
  int64_t bcorr_off = 0;
  int nblocks = 0;  // Fp4 kinds: k / block
  int block = 0;
  int64_t stride = 0;  // bytes per row, a multiple of 64
};
ActLayout make_act_layout(DotKind kind, WeightFormat consumer, int k);
// Bf16 kind: the number of terms in use of a stored row (the header's int32 at 8).
inline int32_t bf16_term_count(const uint8_t* row) {
  int32_t nt;
  std::memcpy(&nt, row + 8, 4);
  return nt;
}
// Stored position of element i in the fp4 value order above (a constant expression, for the
// kernels' own register-order tables; internal linkage, so SIMD translation units share no copy).
static constexpr int fp4_value_position(int i) {
  return (i & ~63) + 32 * (i & 1) + 16 * ((i >> 5) & 1) + ((i >> 1) & 15);
}
static constexpr int fp6_value_position(int i) {
  return (i & ~63) + 32 * ((i >> 4) & 1) + 16 * ((i >> 5) & 1) + (i & 15);
}
// Position of logical element i in the stored value order.
int act_value_position(const ActLayout& l, int i);
// The fp4 and fp6 orders store a 32-group's two 16-value halves 32 positions apart (in its 64-chunk).
inline bool halves_apart(const ActLayout& l) { return l.fp4_order || l.fp6_order; }
// The dequantized values x[0..k) (exact products as double) of a stored row (tests, debugging).
void act_row_values(const ActLayout& l, const uint8_t* row, double* out);

// The dot-product kind of GEMM `gemm` (1 or 2) for a scheme on an ISA; `unquantized_storage`: the
// dtype of unquantized weights (both projections), BF16 / F16 / F32; `tokens_per_expert`: the
// call's average routed tokens per local expert (T·K / E_loc; only a speed choice).
DotKind dot_kind_for(const SchemeInfo& s, Isa isa, int gemm, DType unquantized_storage = DType::BF16,
                     double tokens_per_expert = 1.0);
// Tokens per expert from which MXFP4 W4A4 takes the Bf16 kind on avx512bf16 (measured on a Zen 5,
// qwen3-30b-a3b / gpt-oss-20b, 1 and 2 threads: 1.08–1.27× from 8 tokens per expert, level at 6,
// 0.85–0.9× at 1–4; bench/RESULTS.md 2026-12-03).
inline constexpr double kW4a4Bf16Tokens = 8.0;
// The threshold avx512bf16 uses: kW4a4Bf16Tokens, or never (+∞) where AVX-512 runs on 256-bit
// datapaths (CpuFeatures::avx512_half_width, Zen 4). There the integer kind was 2.0–2.3× faster
// than the Bf16 kind at 8–32 tokens (one core, one GEMM, K = 2048, N = 1536, hot) and the layer
// 1.1–1.3× at 8–16 tokens per expert, 1.25–1.6× at 32–64 (qwen3-30b-a3b, gpt-oss-20b, 2 threads;
// bench/RESULTS.md 2026-12-06, session 39).
double w4a4_bf16_tokens();
// The same switch on amx (the tiles): from a mean of 4.5. The Fp4Mx kernel takes 5–8 tokens in
// two passes of ≤ 4, the tiles in one, and the choice holds for every expert of the call: with a
// Poisson spread of tokens over the experts the expected cost per expert (one core, cold, K =
// 2048, N = 1536, µs per token count: Fp4Mx 127 / 156 / 186 / 247 / 326 / 383 / – / 414 at 1–8,
// the tiles 278 / 268 / 275 / 285 at 4 / 5 / 6 / 8, the Bf16 row kernel 226 / 251 / 313 at 1–3)
// crosses at a mean of ~4.4 (K = 2880, N = 5760: the tiles ahead from 4 tokens). Layer, 2 threads,
// mean 5 (qwen3-30b-a3b T = 80, gpt-oss-20b T = 40): 1.06–1.1×, inside this VM's spread for
// gpt-oss-20b (bench/RESULTS.md 2026-12-06).
inline constexpr double kAmxW4a4Bf16Tokens = 4.5;
// Tokens per expert from which the amx target runs every bf16-exact weight format on the Bf16 kind
// (AMX tiles from gemm_amx.cc's kAmxMinTokens per task), unquantized intermediates included. 6,
// not 8: qwen3-30b-a3b, 2 threads, GEMM1 + GEMM2 ms at 8 → 6, two rounds, T = 96 / 112 (6 / 7
// tokens per expert): MXFP4 weight-only 58.7, 59.0 → 46.9, 47.6 / 62.0, 63.1 → 47.0, 47.4;
// unquantized 59.7, 62.1 → 51.5, 50.2 / 63.0, 64.4 → 49.9, 51.1; MXFP6 level (bench/RESULTS.md
// 2026-12-05 afternoon).
inline constexpr double kAmxBf16Tokens = 6.0;
// MXFP4 weights (W4A16, W4A8, W4A6) and FP8 weights on one-term inputs (bf16 hidden states,
// quantized intermediates; not GEMM2 of an unquantized intermediate, 3 terms: kAmxBf16Tokens):
// the tiles from a mean of 3 / 4 tokens per expert. The F32 kind takes 5–8 tokens in two passes of
// ≤ 4. One core, cold, K = 2048, N = 1536, µs at 1–6 / 8 tokens: MXFP4 F32 147 / 202 / 225 / 281 /
// 560 / 640 / 713, Bf16 (row kernel below 4, tiles from 4) 226 / 251 / 313 / 278 / 268 / 275 / 285;
// FP8 F32 262 / 328 / 352 / 374 / 655 / 713 / 815, Bf16 279 / 456 / 510 / 452 / 452 / 458 / 446:
// with a Poisson spread the expected costs cross at a mean of ~2.7 (MXFP4) and ~3.6 (FP8). Layer,
// 2 threads, ms before → after: qwen3-30b-a3b T = 64 / 80 W4A16 +bf16act 40.0–43.3 → 32.9–39.8 /
// 48.9–52.1 → 36.7–50.6, FP8 52.8–73.6 → 47.0–53.0 / 61.7–66.2 → 48.7–75.9; gpt-oss-20b T = 24 /
// 32 / 40 W4A16 1.15 / 1.28 / 1.4×, FP8 T = 32 / 40 1.14 / 1.33× (bench/RESULTS.md 2026-12-06).
inline constexpr double kAmxMxfp4Bf16Tokens = 3.0;
inline constexpr double kAmxFp8Bf16Tokens = 4.0;
// NVFP4 W4A4 from 8 (its bf16 decode costs more than MXFP4's). One core, one GEMM, cold, µs
// Fp4Nv / Bf16 (AMX), after the ring's prefetch was spread: K = 2048, N = 1536: 4 tokens 253 /
// 460, 6: 386 / 462, 8: 486 / 452, 12: 578 / 468; K = 768, N = 2048: 6 tokens 207 / 239, 8: 241 /
// 234. Layer, qwen3-30b-a3b, 2 threads, 8 tokens per expert, ms with 12 / 8: 50.8–52.2 / 49.2–50.7
// (bench/RESULTS.md 2026-12-06; it was 12 from layer A/Bs before).
inline constexpr double kAmxNvfp4Bf16Tokens = 8.0;
// MXFP6 E2M3 W6A6 on AVX2 takes the integer kind (Fp4Mx with Avx2::w6_weights) below 16 tokens per
// expert; from 16 the F32 kind, which decodes an expert's rows once into a buffer for all its
// tokens where the integer kernel decodes them per group of 4. One core, Zen 3, µs F32 / Fp4Mx: K ×
// N = 2048 × 1536, 1 token 414–532 / 263, 4 tokens 709–868 / 443, 8 tokens 1128–1137 / 885–1133;
// 1024 × 768, 8 tokens 399–429 / 302–309, 12: 441–514 / 344, 16: 450–672 / 518–702, 32: 839–1174 /
// 931–933 (bench/RESULTS.md 2026-12-07, session 47).
inline constexpr double kAvx2W6a6IntTokens = 16.0;

// One projection (w13 or w2) of one local expert, as stored in processed ExpertParams.
struct WeightView {
  WeightFormat fmt = WeightFormat::BF16;
  DType dtype = DType::F32;       // BF16 format: element storage BF16 / F16 / F32
  int rows = 0, cols = 0;         // N (outputs), K (reduction)
  int64_t row_bytes = 0;          // packed bytes per row
  const uint8_t* data = nullptr;  // row 0 of this expert
  const uint8_t* scales = nullptr;  // MX: E8M0 [rows, cols/32]; NVFP4: F8_E4M3 [rows, cols/16]
  const float* channel_scale = nullptr;  // per-channel [rows], or null
  float tensor_scale = 1.0f;      // per-tensor scale multiplying the dot product (1 when none)
  float nv_global = 1.0f;         // NVFP4 weight_scale_2 (inside the block factor fp8(s)·ws2)
  const void* bias = nullptr;     // [rows] in bias_dtype (F32 / BF16 / F16), or null
  DType bias_dtype = DType::F32;
};

// One GEMM task: output rows [row0, row1) of one expert for `ntok` gathered input rows.
//   out[j·ldo + n] = (dot(act row j, weight row n) · row_scale_j · wscale_n + bias_n) · post_mul[j]
// where act row j lives at act_base + act_index[j]·layout.stride.
struct GemmArgs {
  const WeightView* w = nullptr;
  const ActLayout* layout = nullptr;
  const uint8_t* act_base = nullptr;
  const int32_t* act_index = nullptr;  // [ntok]
  int ntok = 0;
  int row0 = 0, row1 = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  const float* post_mul = nullptr;  // [ntok] router weights (GEMM2), or null
};

// Quantize one fp32 row x[0..k) with `rule` into `dst` (layout `l`). `tensor_scale` is the
// Fp8DynTensor scale (ignored otherwise).
struct QuantRowArgs {
  const ref::ActQuantRule* rule = nullptr;
  const ActLayout* layout = nullptr;
  float tensor_scale = 0.0f;
  const float* x = nullptr;
  uint8_t* dst = nullptr;
};

// The gated activation as plain data (ActivationSpec holds a std::optional; the SIMD translation
// units use no library inline code, see simd/gemm.h).
struct ActParams {
  Activation kind = Activation::Silu;
  bool interleaved = false;
  bool has_limit = false;
  float limit = 0.0f;
  float alpha = 1.702f;
  const ActivationSpec* spec = nullptr;  // the original, for the scalar fallback
};
ActParams act_params_of(const ActivationSpec& a);

struct KernelTable {
  Isa isa = Isa::Scalar;
  void (*quantize_row)(const QuantRowArgs& a) = nullptr;
  void (*gemm)(const GemmArgs& a) = nullptr;
  // z[0..inter) = act(gate, up) from one GEMM1 output row y1[0..2·inter) (ref::apply_activation_row).
  void (*activation_row)(const ActParams& act, const float* y1, int inter, float* z) = nullptr;
  float (*abs_max)(const float* x, int64_t n) = nullptr;  // NaN propagates
};

const KernelTable& kernel_table(Isa isa);
// Bytes ahead that the one-row weight streams (one token: one row after the other; simd/gemm.h
// row_stream_prefetch) prefetch: 4 KB (the AMX Xeon: 2 KB was 5–12 % slower, bench/RESULTS.md
// 2026-12-05 late), 1 KB where CpuFeatures::near_row_prefetch (Zen 3, one core, K = 2048, N = 1536,
// bf16 weights: 442–495 µs at 4 KB, 324–340 at 1 KB, a plain read of the same rows 299–311;
// RESULTS 2026-12-06, session 42). Read once.
int64_t row_stream_distance();
// Per-target GEMM entry points (gemm_<target>.cc), read by the target's table (quant_<target>.cc).
void gemm_avx512(const GemmArgs& a);
void gemm_avx2(const GemmArgs& a);
void gemm_amx(const GemmArgs& a);  // AMX tiles for experts with many tokens, else gemm_avx512
// 64-byte aligned per-thread scratch (slot 0..3), grown as needed, valid until the next call
// with the same slot on the same thread.
void* thread_scratch_buffer(int slot, size_t bytes);
const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx512bf16_kernels();  // avx512's functions; its DotKind::Bf16 paths need AVX512_BF16
const KernelTable& amx_kernels();         // avx512bf16's, with gemm_amx

// Shared helpers used by every ISA.
// Fills the Fp4 correction words of a quantized row from its values (no-op for other kinds).
void fill_fp4_corrections(const ActLayout& l, uint8_t* row);
// Only the per-block words (bcorr_off), from the per-4 words (corr_off).
void fill_fp4_block_corrections(const ActLayout& l, uint8_t* row);
float bias_value(const WeightView& w, int n);
// Scalar activation (ref::apply_activation_row).
void activation_row_scalar(const ActParams& act, const float* y1, int inter, float* z);
// Non-inline wrappers of formats.h for the SIMD translation units (which must not instantiate
// library inline functions: the linker may keep their copy, compiled for a wider ISA).
int mx_shared_exponent_of(float amax, int elem /* MxElem */, int mode /* MxScaleMode */);
float fp8_e4m3_round(float v);  // decode(encode(v))
float abs_max_scalar(const float* x, int64_t n);
// Fp8 / int8 / MX / NVFP4 scalar row quantizer (the definition: formats.h, like ref::act_qdq_row).
void quantize_row_scalar(const QuantRowArgs& a);
// 256-entry tables built from formats.h: E8M0 byte → 2^(s−127) (255 → NaN); F8_E4M3 code → value.
const float* e8m0_table();
const float* fp8_e4m3_table();
// bf16 bits of every code of an MX element format (formats.h decode, exact in bf16): MXFP4 16
// entries, MXFP6 64; and the range [smin, smax] of E8M0 scale bytes for which every nonzero code
// times 2^(s−127) is a normal bf16 (so adding s−127 to the exponent field is exact).
struct MxBf16Table {
  const uint16_t* codes = nullptr;
  int smin = 0, smax = 0;
};
MxBf16Table mx_bf16_table(WeightFormat f);
// bf16 bits of the 128 FP8 E4M3 magnitudes (codes 0x00..0x7F; 0x7F → NaN), exact in bf16.
const uint16_t* fp8_bf16_magnitudes();
// Bf16 kind: splits the fp32 values vals[0..k_pad) (stored order) into the term rows of `row` and
// sets the header's term count (the scalar definition of the split).
void split_bf16_terms(const ActLayout& l, const float* vals, uint8_t* row);

}  // namespace qmoe::cpu
