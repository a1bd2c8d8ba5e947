// Internal declarations shared by the CUDA backend's host code (.cc) and kernels (.cu).
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the driver is reached through the runtime's entry point)
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/frag_layout.h"
#include "qmoe/config.h"
#include "qmoe/cuda.h"
#include "qmoe/formats.h"
#include "qmoe/schemes.h"

namespace qmoe::cuda {

// Throws qmoe::Error naming the call, file and line when `e` is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define QMOE_CUDA_CHECK(x) ::qmoe::cuda::check_cuda((x), #x, __FILE__, __LINE__)

// A grow-only device allocation for per-call work buffers: need<T>(n) returns room for n ≥ 1
// elements (n = 0 asks for one, so a pointer is always valid), reallocating only when it grows.
class GrowBuf {
 public:
  GrowBuf() = default;
  ~GrowBuf() {
    if (p_) cudaFree(p_);
  }
  GrowBuf(const GrowBuf&) = delete;
  GrowBuf& operator=(const GrowBuf&) = delete;
  template <class T = char> T* need(size_t count) {
    const size_t bytes = (count == 0 ? 1 : count) * sizeof(T);
    if (bytes > n_) {
      if (p_) QMOE_CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      QMOE_CUDA_CHECK(cudaMalloc(&p_, bytes));
      n_ = bytes;
    }
    return static_cast<T*>(p_);
  }
  template <class T> T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Weight element formats as the GEMM kernels see them.
enum class WFmt : int { BF16, FP8, INT8, MXFP4, MXFP6_E2M3, MXFP6_E3M2, NVFP4 };
// GEMM activation operand: bf16 values, bf16 hi + lo pair (fp32-accurate), int8 codes, e4m3 codes
// (FP8 W8A8 on the e4m3 tensor cores, CudaOptions::fp8_mma: one byte per element, each 16-element
// chunk of a row in the order e4m3_act_pos gives, qdq_fast.h).
enum class AFmt : int { Bf16, Bf16Split, Int8, E4m3 };

constexpr int kBW = 128;      // weight rows (GEMM output features) per CTA tile
constexpr int kGemmThreads = 128;
constexpr int kMaxSplit = kMaxKSplit;  // qmoe/cuda.h

// Stored bytes of one row of K elements (K a multiple of 64 after padding).
constexpr int64_t packed_row_bytes(WFmt f, int64_t k) {
  switch (f) {
    case WFmt::BF16: return 2 * k;
    case WFmt::FP8:
    case WFmt::INT8: return k;
    case WFmt::MXFP4:
    case WFmt::NVFP4: return k / 2;
    default: return 3 * k / 4;  // fp6
  }
}
// K elements per pipeline stage (must match WTraits<>::kBK in gemm.cuh): 64 for bf16, 128 else.
constexpr int stage_k(WFmt f) { return f == WFmt::BF16 ? 64 : 128; }
// Block-scale bytes per row per stage (MX: one E8M0 byte per 32, NVFP4: one FP8 byte per 16).
inline int scale_bytes_per_stage(WFmt f) {
  return (f == WFmt::MXFP4 || f == WFmt::MXFP6_E2M3 || f == WFmt::MXFP6_E3M2) ? stage_k(f) / 32
         : f == WFmt::NVFP4                                                   ? stage_k(f) / 16
                                                                              : 0;
}

// BF16 and INT8 weights are stored per (128-row, 128-byte) stage 128B-swizzled (sw128_chunk,
// frag_layout.h), the layout wgmma reads from shared memory: a stage block goes to shared memory
// as it is (one bulk copy, gemm_wgmma.cuh); the mma.sync kernel undoes the swizzle in its copy.
static_assert(packed_row_bytes(WFmt::BF16, stage_k(WFmt::BF16)) == 128 && packed_row_bytes(WFmt::INT8, stage_k(WFmt::INT8)) == 128,
              "BF16 / INT8 stages: one 128-byte swizzle row per weight row");

// FP4 weights (MXFP4, NVFP4) are stored per (128-row, 128-K) stage in MMA-fragment order: 8 KB =
// [warp 4][q 4][lane 32][j 4] 32-bit words; word (w, q, lane, j) is fragment f = 4q + j
// (m-fragment f / 8, k16 step f % 8) of lane (g = lane / 4, c = lane % 4) and holds the 8 codes
// of registers a0..a3: e[r0][2c, 2c+1], e[r1][2c, 2c+1], e[r0][2c+8, 2c+9], e[r1][2c+8, 2c+9],
// r0 = 32w + 16·(f/8) + g, r1 = r0 + 8, k relative to 16·(f % 8), at the bit positions of
// frag_layout.h; their block scales are stored in its kernel form.
inline bool fp4_fragment_layout(WFmt f) { return f == WFmt::MXFP4 || f == WFmt::NVFP4; }
// FP8 weights likewise, 16 KB per stage = [warp 4][q 8][lane 32][4] 32-bit words; word f = 4q + j
// of a lane is (m-fragment mt = f / 16, k16 step kk = (f / 2) % 8, p = f % 2) and holds the e4m3
// codes of registers a(2p) (low 16 bits) and a(2p+1): p = 0: e[r0][2c, 2c+1], e[r1][2c, 2c+1];
// p = 1: the same at k + 8 (each pair low element first, decoded by cvt.rn.f16x2.e4m3x2).
inline bool fp8_fragment_layout(WFmt f) { return f == WFmt::FP8; }
// FP6 weights (MXFP6 E2M3 / E3M2): per stage 12 KB = an FP4-layout plane-4 block (8 KB) and a
// plane-2 block (4 KB), see frag_layout.h.
inline bool fp6_fragment_layout(WFmt f) { return f == WFmt::MXFP6_E2M3 || f == WFmt::MXFP6_E3M2; }

// One grouped GEMM over the routed slots: for every tile (local expert e, rows m0.. of its slot
// list) and 128 weight rows n0.., out[split][slot][n] = escale[e] · colscale[e][n] · rowscale[arow]
//   · Σ_{k in split} A[arow][k] · W[e][n][k],   arow = slot / a_row_div.
struct GemmArgs {
  const uint8_t* w = nullptr;       // tile-major [E_loc][Npad/128][Kt][128 rows][stage bytes]
  int64_t w_expert_stride = 0;      // bytes
  int64_t w_row_bytes = 0;          // packed_row_bytes(Kpad) (informational)
  const uint8_t* wscale = nullptr;  // [E_loc][Kt][Npad][scale_bytes_per_stage] or null
  int64_t ws_expert_stride = 0;     // bytes
  const float* colscale = nullptr;  // [E_loc][Npad] (per-channel) or null
  const float* escale = nullptr;    // [E_loc] per-expert factor (always set)
  const void* a_hi = nullptr;       // [rows][Kpad] bf16, or int8 for AFmt::Int8
  const void* a_lo = nullptr;       // [rows][Kpad] bf16 (AFmt::Bf16Split)
  int64_t a_row_bytes = 0;          // Kpad · element size
  const float* a_rowscale = nullptr;  // [rows] or null
  int a_row_div = 1;                // K for GEMM1 (row = token), 1 for GEMM2 (row = slot)
  const int32_t* sorted_slots = nullptr;
  const int32_t* offsets = nullptr;  // [E_loc + 1]
  const int32_t* counts = nullptr;   // [E_loc]
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_m0 = nullptr;
  const int32_t* num_tiles = nullptr;
  float* out = nullptr;             // [ksplit][TK][N]
  int N = 0, Npad = 0, TK = 0;
  int Kt = 0, kt_per_split = 0;
  // The tile lists come from the kernel just before this one (launch_prep), not from two places
  // before: read them only after pdl_wait (launch.cuh).
  bool tiles_after_wait = false;
  int f8_kernel = 0;  // AFmt::E4m3: CudaOptions::fp8_kernel, resolved (0, 1, 2)
  // Activation tiles by TMA (the warp-specialised kernels, 64- / 128-token tiles: ws_tma_built): the
  // operand in tile order — its row offsets[e] + m + i holds the row of sorted slot offsets[e] + m
  // + i (launch_gather_rows, RowOut::row_map) — read through 2-D tensor maps (make_rows_tmap: 128
  // bytes × the tile's rows per box, 128B-swizzled) of the hi and, Bf16Split, lo rows. a_hi / a_lo /
  // a_rowscale keep their meaning (the row scales are read per slot as before).
  bool a_tma = false;
  // The wgmma kernels run a tile's MMAs only as wide as its tokens need (wg_fit_n: the token count
  // rounded up to 32); off (fit_n_enabled: QMOE_CUDA_FITN=0), every MMA is the tile's full width.
  bool fit_n = true;
  // The warp-specialised kernels (gemm_ws_kernel, gemm_ws_f8_kernel): > 0, persistent — at most this
  // many CTAs (the SM count), each looping over the classic grid's items (gemm_wgmma.cuh ws_sched);
  // 0, one CTA per item. persist_y / persist_z: the classic grid's y and z, set by the launch.
  int persist = 0;
  int persist_y = 0, persist_z = 0;
  // Persistent: the work counter the CTAs claim items from (zero when the kernel starts: align zeroes
  // it, AlignArgs::num_tiles), one per GEMM of a layer.
  int* claim = nullptr;
  CUtensorMap tma_hi{}, tma_lo{};
};
bool fit_n_enabled();

// A tensor map of `rows` rows of `row_bytes` bytes (a multiple of 16) at `base` (16-byte aligned):
// boxes of 128 bytes × box_rows rows, 128B-swizzled in shared memory as wgmma reads them, rows past
// the end read as zeros.
CUtensorMap make_rows_tmap(const void* base, int64_t rows, int64_t row_bytes, int box_rows);
// dst row p ← src row sorted_slots[p] / row_div for p < offsets[E_loc] (the local slots in expert
// order), row_bytes each (a multiple of 16); hi and, when both are set, lo.
void launch_gather_rows(const void* src_hi, const void* src_lo, int64_t row_bytes, const int32_t* sorted_slots,
                        int row_div, const int32_t* total, int max_rows, void* dst_hi, void* dst_lo, cudaStream_t s);
// Whether the warp-specialised kernel with TMA activation tiles is built for this format,
// activation operand and token tile (64 or 128).
bool ws_tma_built(WFmt wf, AFmt af, int bt);

// bt: token tile (8, 16, 32, 64, 128); wg: tiles of 32 and up may run on the wgmma kernel (gemm_wgmma.cuh);
// the caller passes CudaOptions::wgmma && wgmma_available().
void launch_gemm(WFmt wf, AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_bf16(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_fp8(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_int8(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_mxfp4(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_mxfp6(WFmt wf, AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);
void launch_gemm_nvfp4(AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s);

// Row quantization rule (the activation quantizer of the scheme, spec §9.1, §10).
struct RowQuant {
  ActQuant mode = ActQuant::None;
  MxScaleMode mx_mode = MxScaleMode::Even;
  bool split = false;                    // None: also write the bf16 low part
  bool f16 = false;                      // FP8 modes: write fp16 (for FP8-weight GEMMs) instead of bf16
  bool e4m3 = false;                     // FP8 modes: write e4m3 codes at e4m3_act_pos (AFmt::E4m3)
  float static_scale = 0.0f;             // fp8/int8 static: dequant-direction s; nvfp4: gs
  const unsigned* tensor_amax = nullptr;  // Fp8DynTensor: float bits of max |v| over the tensor
};
// Outputs of a row quantizer: row r at a_hi + r·stride (bf16 or int8 elements), a_lo likewise,
// rowscale[r] (dynamic modes).
struct RowOut {
  void* a_hi = nullptr;
  void* a_lo = nullptr;
  float* rowscale = nullptr;
  int64_t stride = 0;  // elements per row (Kpad)
  // When set, the values of row r go to row row_map[r] (the tile order of GemmArgs::a_tma:
  // AlignArgs::slot_pos); rowscale[r] stays at r.
  const int32_t* row_map = nullptr;
  QMOE_HD int64_t value_row(int64_t r) const { return row_map ? row_map[r] : r; }
};

struct ActParams {
  Activation kind = Activation::Silu;
  bool interleaved = false;
  float alpha = 1.702f;
  float limit = 0.0f;
  bool has_limit = false;
};

// Align: slot lists per local expert and the tile list for token tile `bt`.
struct AlignArgs {
  const int32_t* topk_ids = nullptr;   // [TK]
  const int32_t* expert_map = nullptr; // [E]
  int TK = 0, E = 0, E_loc = 0, bt = 16;
  int32_t* slot_local = nullptr;       // [TK] local expert of the slot or −1
  int32_t* counts = nullptr;           // [E_loc]
  int32_t* offsets = nullptr;          // [E_loc + 1]
  int32_t* sorted_slots = nullptr;     // [TK]
  int32_t* slot_pos = nullptr;         // [TK] position of a local slot in sorted_slots (the inverse)
  int32_t* tile_expert = nullptr;      // [max_tiles]
  int32_t* tile_m0 = nullptr;
  int32_t* num_tiles = nullptr;        // [3]: the tile count, then two work counters set to 0 (GemmArgs::claim)
  // Tests of the launch order (launch.cuh): align holds back this long after it lets its
  // dependants start and before it writes anything (set_align_debug_delay_ns; 0 in use).
  int debug_delay_ns = 0;
  // TK ≤ kWarpAlignSlots: one warp ranks the slots (align_warp in moe_kernels.cu) instead of the
  // block-wide count and scans over kMaxLocalExperts (warp_align_enabled()).
  bool warp_rank = false;
};
constexpr int kWarpAlignSlots = 32;
// The one-warp align for decode, on unless QMOE_CUDA_WARP_ALIGN=0 (read once).
bool warp_align_enabled();
// For tests: every align launched from now on (CudaExperts::run_device) waits `ns` nanoseconds after
// its trigger, so that a kernel reading align's outputs before its own wait reads stale ones.
void set_align_debug_delay_ns(int ns);
int align_debug_delay_ns();
constexpr int kMaxLocalExperts = 4096;
void launch_align(const AlignArgs& a, cudaStream_t s);

// max |x·w| over [T, H] into *amax_bits (must be zeroed first), rows holding a non-finite value
// left out; w = topk_w[t·K] when on_input.
// Element type of the layer input x (hidden states) as the engine holds it.
enum class XType : int { F32, BF16, F16 };
void launch_absmax_input(const void* x, XType xt, int T, int H, const float* topk_w, int K, bool on_input,
                         unsigned* amax_bits, cudaStream_t s);
// GEMM1 input: x [T, H] (× topk_w[t·K] when on_input) quantized per token row into `out`.
// bad[t] ← 1 when token t's row (after the routing weight, when applied on the input) holds a
// non-finite value; its quantized row is zeros and combine writes its output row as NaN.
// after_align: launched right after launch_align (no kernel between them): the rows are quantized
// beside align and the grid waits for it only at its end (quant_input_row).
void launch_quant_input(const void* x, XType xt, int T, int H, const float* topk_w, int K, bool on_input,
                        const RowQuant& q, const RowOut& out, int32_t* bad, bool after_align, cudaStream_t s);
// launch_align and launch_quant_input as one launch (T + 1 blocks): one kernel boundary fewer on
// a decode step's critical path. The GEMM after it must read the tile lists after its pdl_wait
// (GemmArgs::tiles_after_wait). Used for T < kFusedPrepMaxRows without a tensor-wide scale pass
// (QMOE_CUDA_FUSE_PREP=0 in the environment turns it off). smem_optin: the device's opt-in shared
// memory per block; a row too wide to share a block with align takes the two launches.
constexpr int kFusedPrepMaxRows = 512;
void launch_prep(const AlignArgs& al, const void* x, XType xt, int T, int H, const float* topk_w, int K,
                 bool on_input, const RowQuant& q, const RowOut& out, int32_t* bad, int smem_optin, cudaStream_t s);
bool fused_prep_enabled();
// GEMM1 consumer: y1 = Σ_split y1p + b13, z = act(gate, up) per local slot, quantized into `out`.
// With defer (per-tensor dynamic), z goes to zbuf [TK][I] and its max |z| to q.tensor_amax, and
// launch_quant_rows quantizes afterwards. num_sms: the device's SM count (the decode row split).
void launch_act(const float* y1p, int ksplit, int TK, int I, const int32_t* slot_local, const float* b13,
                const ActParams& act, const RowQuant& q, const RowOut& out, bool defer, float* zbuf,
                unsigned* amax_bits, int num_sms, cudaStream_t s);
void launch_quant_rows(const float* zbuf, int TK, int I, const int32_t* slot_local, const RowQuant& q,
                       const RowOut& out, cudaStream_t s);
// out[t][h] (+)= Σ_k w[t,k] · (Σ_split y2p[split][t·K+k][h] + b2[e][h]) over local slots.
void launch_combine(const float* y2p, int ksplit, int T, int K, int H, const int32_t* slot_local,
                    const float* topk_w, bool on_input, const float* b2, float* out, bool accumulate,
                    const int32_t* bad, cudaStream_t s);

// Random fill for benchmarks (device): bytes in [lo, hi] after masking per format, see random_init.cu.
// Nvfp4KernelScales: E4M3 scales in [lo, hi] in the GEMM's kernel form (frag_layout.h).
enum class RandKind : int { Bytes, Fp8Codes, Bf16Values, E8M0Scales, Fp8Scales, Nvfp4KernelScales, F32Values };
void launch_random_fill(void* p, int64_t count, RandKind kind, uint64_t seed, float lo, float hi, cudaStream_t s);

}  // namespace qmoe::cuda
