// CudaExperts: upload / repack of the expert parameters, work buffers, and the per-call launch
// sequence (align → input quantization → GEMM1 → activation + quantization → GEMM2 → combine).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/cuda_common.h"
#include "cuda/frag_layout.h"
#include "cuda/gemm_wgmma_host.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"

namespace qmoe::cuda {

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  throw Error(std::string("CUDA error '") + cudaGetErrorString(e) + "' (" + cudaGetErrorName(e) + ") in " + what +
              " at " + file + ":" + std::to_string(line));
}

namespace {

// GEMM1 reads its activation tiles by TMA (after a gather into tile order) from this many output
// features on (experts.cc, run_device).
constexpr int kTmaGatherMinN = 4096;

std::string str(const Shape& s) { return shape_str(s); }

// Owning device allocation.
class DevBuf {
 public:
  DevBuf() = default;
  ~DevBuf() { reset(); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_; n_ = o.n_;
      o.p_ = nullptr; o.n_ = 0;
    }
    return *this;
  }
  void alloc(size_t bytes, bool zero = true) {
    reset();
    if (bytes == 0) return;
    QMOE_CUDA_CHECK(cudaMalloc(&p_, bytes));
    n_ = bytes;
    if (zero) QMOE_CUDA_CHECK(cudaMemset(p_, 0, bytes));
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

WFmt wfmt_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return WFmt::BF16;
    case WeightFormat::Fp8E4M3: return WFmt::FP8;
    case WeightFormat::Int8: return WFmt::INT8;
    case WeightFormat::Mxfp4: return WFmt::MXFP4;
    case WeightFormat::Mxfp6E2M3: return WFmt::MXFP6_E2M3;
    case WeightFormat::Mxfp6E3M2: return WFmt::MXFP6_E3M2;
    case WeightFormat::Nvfp4: return WFmt::NVFP4;
  }
  return WFmt::BF16;
}

// Stored bytes of a row of k elements in the checkpoint layout.
int64_t stored_row_bytes(WFmt f, int64_t k) { return packed_row_bytes(f, k); }

bool is_dyn_rowscale(ActQuant a) {
  return a == ActQuant::Fp8DynToken || a == ActQuant::Fp8DynTensor || a == ActQuant::Int8DynToken;
}

}  // namespace

// One projection's weights on the device.
struct DevWeights {
  DevBuf w, scales, colscale, escale, bias;
  int N = 0, K = 0, Npad = 0, Kpad = 0, Kt = 0;
  int64_t row_bytes = 0, expert_stride = 0, sc_expert_stride = 0;
  std::vector<float> epi;  // per-expert factor the weight layout moved into the epilogue (FP4: 2^c, 2^8)
};

struct CudaExperts::Impl {
  const SchemeInfo* scheme = nullptr;
  CudaOptions opt;
  WFmt wf = WFmt::BF16;
  AFmt af = AFmt::Bf16;
  int E = 0, E_loc = 0, H = 0, I = 0;
  ActParams act;
  MxScaleMode mx_mode = MxScaleMode::Even;
  float a13 = 0.0f, a2 = 0.0f;  // static activation scales (dequant direction) or NVFP4 gs
  DevWeights w13, w2;
  DevBuf expert_map;
  int num_sms = 132;
  int smem_optin = 0;  // the device's shared memory per block (opt-in maximum)

  // Work buffers (reserve).
  int max_T = 0, max_K = 0, cap_rows = 0;
  DevBuf slot_local, sorted_slots, slot_pos, counts, offsets, tile_expert, tile_m0, num_tiles;
  DevBuf bad;  // [max_T] token rows with non-finite hidden states (quant_input → combine)
  // opt.wgmma and this build's wgmma kernels run on the device: resolved once at construction
  // (a device-properties query), not per launch.
  bool wgmma = false;
  // CudaOptions::fp8_mma on an FP8 scheme with the wgmma kernels: calls whose token tile is 64 or
  // more quantize into a1_e8 / a2_e8 (e4m3 codes, rows of Kpad bytes, AFmt::E4m3). Their own
  // buffers, zeroed once: the K padding of every row stays zero (no fp16 row ever lands there).
  bool fp8_mma = false;
  int f8_kernel = 0;  // CudaOptions::fp8_kernel resolved (GemmArgs::f8_kernel)
  DevBuf a1_e8, a2_e8;
  DevBuf a1_hi, a1_lo, a1_scale, a2_hi, a2_lo, a2_scale, y1p, y2p, zbuf, amax;
  // The GEMM operands in tile order for the TMA activation tiles (GemmArgs::a_tma): [TK][Kpad]
  // rows of either GEMM's input, hi and lo (GEMM1's only where it takes the path, tma_gather1).
  // Reserved (tma_rows > 0) for up to TK ≥ 128 slots on the wgmma kernels unless CudaOptions::tma
  // (QMOE_CUDA_TMA) is 0: a second copy of GEMM2's operand buffer, and of GEMM1's T · K rows.
  int tma_mode = 1;  // CudaOptions::tma resolved
  int persist = 1;  // CudaOptions::persist resolved: 0 off, 1 one CTA per SM, n ≥ 2 at most n CTAs
  int tma_rows = 0;
  DevBuf a1s_hi, a1s_lo, a2s_hi, a2s_lo;
  // Host-call staging.
  DevBuf h_x, h_ids, h_w, h_out;
  int h_T = 0, h_K = 0;

  int a_elem_bytes() const { return af == AFmt::Int8 ? 1 : 2; }
  // GEMM1 takes the TMA path too (its operand gathered into tile order first).
  bool tma_gather1() const { return tma_mode == 2 || tma_mode == 4 || w13.N >= kTmaGatherMinN; }
  // 64-token tiles take the TMA path too (modes 1 and 2; 3 and 4 keep it to 128-token tiles).
  bool tma_tile64() const { return tma_mode == 1 || tma_mode == 2; }

  struct Plan {
    int bt = 16, max_tiles = 0, ks1 = 1, ks2 = 1, kps1 = 0, kps2 = 0;
  };
  Plan plan(int T, int K) const;
  int choose_split(int64_t ctas, int Kt, int TK) const;
};

namespace {

// A plane of FP4-layout fragment words (frag_layout.h, stage layout in cuda_common.h): for every
// (128-row, 128-K) stage, 2048 words [warp 4][q 4][lane 32][j 4] at dst + stage · stage_bytes;
// code(n, k) gives the 4-bit code of element (n, k) (rows ≥ N and K ≥ K: zero codes).
template <class Code>
void write_fp4_plane(Code code, int ntiles, int Kt, int64_t stage_bytes, uint8_t* dst) {
  for (int nt = 0; nt < ntiles; ++nt)
    for (int kt = 0; kt < Kt; ++kt) {
      uint32_t* out = reinterpret_cast<uint32_t*>(dst + (int64_t{nt} * Kt + kt) * stage_bytes);
      for (int w = 0; w < 4; ++w)
        for (int q = 0; q < 4; ++q)
          for (int lane = 0; lane < 32; ++lane)
            for (int jw = 0; jw < 4; ++jw) {
              const int f = 4 * q + jw, mt = f / 8, kk = f % 8, g = lane / 4, c = lane % 4;
              const int r0 = nt * 128 + 32 * w + 16 * mt + g;
              const int k0 = kt * 128 + 16 * kk + 2 * c;
              uint32_t word = 0;
              for (int j = 0; j < 4; ++j)  // a0..a3: rows r0 / r0 + 8, k0 / k0 + 8
                for (int h = 0; h < 2; ++h) word |= fp4_frag_place(code(r0 + 8 * (j & 1), k0 + 8 * (j >> 1) + h), j, h);
              *out++ = word;
            }
    }
}

// FP4 codes of one expert ([N][K/2] packed rows). NVFP4: codes under a zero block scale become +0
// and under a negative one change sign, so that the kernel multiplies by the scale's magnitude
// only (nvfp4_scale_byte).
void repack_fp4_fragments(const uint8_t* src, const uint8_t* nv_scales, int nb, int N, int K, int ntiles, int Kt,
                          uint8_t* dst) {
  const int64_t src_row = K / 2;
  auto code = [&](int n, int k) -> uint32_t {
    if (n >= N || k >= K) return 0u;
    uint32_t c = fp4_code_at(src + int64_t{n} * src_row, k);
    if (nv_scales) {
      const uint8_t sc = nv_scales[int64_t{n} * nb + k / kNvfp4Block];
      if ((sc & 0x7F) == 0) c = 0;
      else if (sc & 0x80) c ^= 8u;
    }
    return c;
  };
  write_fp4_plane(code, ntiles, Kt, kBW * 64, dst);
}

// FP8 codes of one expert ([N][K] bytes) → fragment words per (128-row, 128-K) stage
// (cuda_common.h); rows ≥ N and K ≥ K are zero codes.
void repack_fp8_fragments(const uint8_t* src, int N, int K, int ntiles, int Kt, uint8_t* dst) {
  auto code = [&](int n, int k) -> uint32_t { return (n < N && k < K) ? src[int64_t{n} * K + k] : 0u; };
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int nt = 0; nt < ntiles; ++nt)
    for (int kt = 0; kt < Kt; ++kt)
      for (int w = 0; w < 4; ++w)
        for (int q = 0; q < 8; ++q)
          for (int lane = 0; lane < 32; ++lane)
            for (int jw = 0; jw < 4; ++jw) {
              const int f = 4 * q + jw, mt = f / 16, kk = (f / 2) % 8, p = f % 2, g = lane / 4, c = lane % 4;
              const int r0 = nt * 128 + 32 * w + 16 * mt + g;
              const int k0 = kt * 128 + 16 * kk + 2 * c + 8 * p;
              *out++ = code(r0, k0) | code(r0, k0 + 1) << 8 | code(r0 + 8, k0) << 16 | code(r0 + 8, k0 + 1) << 24;
            }
}

// MX weights on the fragment path (MXFP4, MXFP6): the per-expert shift c of frag_layout.h from
// the expert's E8M0 bytes ([N][nb]); blocks whose codes are all ±0 don't bound it from below.
template <class NonZero>
int mx_shift(const uint8_t* scales, int N, int nb, int bias, int margin, NonZero block_nonzero, const std::string& what) {
  int s_max = 0, s_min = 255;
  for (int n = 0; n < N; ++n)
    for (int b = 0; b < nb; ++b) {
      const int s = scales[int64_t{n} * nb + b];
      if (s == 255)
        throw Error("CUDA experts: " + what + " holds the E8M0 NaN scale (255) at row " + std::to_string(n) +
                    ", block " + std::to_string(b));
      s_max = std::max(s_max, s);
      if (block_nonzero(n, b)) s_min = std::min(s_min, s);
    }
  const int c = std::max(0, s_max + bias - 254);
  if (s_min != 255 && s_min + margin < c)
    throw Error("CUDA experts: " + what + " has E8M0 block scales from 2^" + std::to_string(s_min - 127) + " to 2^" +
                std::to_string(s_max - 127) + ", a wider range than the CUDA kernels represent exactly (" +
                std::to_string(254 - bias + margin) + " binades)");
  return c;
}

// FP6 codes of one expert ([N][K·3/4] packed rows) → per (128-row, 128-K) stage: the plane-4
// words in the FP4 fragment layout (8 KB), then the plane-2 words (4 KB = [warp 4][q 2][lane 32]
// [4]; word v = 4q + j of a lane is k16 step v, slots 4·mt + j) (frag_layout.h).
void repack_fp6_fragments(const uint8_t* src, bool e3m2, int N, int K, int ntiles, int Kt, uint8_t* dst) {
  const int64_t src_row = int64_t{K} * 3 / 4;
  auto code = [&](int n, int k) -> uint32_t {
    return (n < N && k < K) ? fp6_code_at(src + int64_t{n} * src_row, k) : 0u;
  };
  constexpr int64_t kStage = kBW * 96;
  write_fp4_plane([&](int n, int k) { return fp6_plane4_code(code(n, k), e3m2); }, ntiles, Kt, kStage, dst);
  for (int nt = 0; nt < ntiles; ++nt)
    for (int kt = 0; kt < Kt; ++kt) {
      uint32_t* p2 = reinterpret_cast<uint32_t*>(dst + (int64_t{nt} * Kt + kt) * kStage) + 2048;
      for (int w = 0; w < 4; ++w)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int v = 0; v < 8; ++v) {  // plane-2 word v = k16 step v
            uint32_t word = 0;
            for (int mt = 0; mt < 2; ++mt) {
              const int r0 = nt * 128 + 32 * w + 16 * mt + g, k0 = kt * 128 + 16 * v + 2 * c;
              for (int j = 0; j < 4; ++j)
                for (int h = 0; h < 2; ++h)
                  word |= fp6_plane2_place(code(r0 + 8 * (j & 1), k0 + 8 * (j >> 1) + h), e3m2, 4 * mt + j, h);
            }
            p2[w * 256 + ((v / 4) * 32 + lane) * 4 + v % 4] = word;
          }
        }
    }
}

void upload_projection(const ExpertParams& p, const Tensor& w, const Tensor* bscale, const Tensor* colscale,
                       const Tensor* bias, WFmt f, int N, int K, const char* name, DevWeights& d) {
  const int E_loc = p.num_local;
  const std::string nm = name;
  const int64_t src_row = stored_row_bytes(f, K);
  if (!w.defined()) throw Error("CUDA experts: " + nm + "_weight is missing");
  if (w.ndim() != 3 || w.dim(0) != E_loc || w.dim(1) != N ||
      static_cast<int64_t>(w.nbytes()) != int64_t{E_loc} * N * src_row)
    throw Error("CUDA experts: " + nm + "_weight has shape " + str(w.shape()) + " (" + std::to_string(w.nbytes()) +
                " bytes), expected [" + std::to_string(E_loc) + ", " + std::to_string(N) + ", ·] holding " +
                std::to_string(src_row) + " bytes per row (" + std::to_string(K) + " " +
                std::string(to_string(p.scheme->weight)) + " elements)");
  d.N = N;
  d.K = K;
  d.Npad = static_cast<int>(round_up(N, kBW));
  d.Kpad = static_cast<int>(round_up(K, stage_k(f)));
  d.Kt = d.Kpad / stage_k(f);
  d.row_bytes = packed_row_bytes(f, d.Kpad);
  d.expert_stride = d.row_bytes * d.Npad;
  d.w.alloc(static_cast<size_t>(d.expert_stride) * E_loc);
  // Tile-major repack, zero padded (code 0 = +0 in every format): [Npad/128][Kt][128][stage bytes],
  // so that each pipeline stage of a CTA reads one contiguous block.
  const int64_t sb = packed_row_bytes(f, stage_k(f));
  const int spb = scale_bytes_per_stage(f);
  const int blk = f == WFmt::NVFP4 ? kNvfp4Block : kMxBlock;
  const int nb = K / blk;
  if (spb > 0) {
    if (!bscale || !bscale->defined()) throw Error("CUDA experts: " + nm + "_weight_scale is missing");
    if (bscale->ndim() != 3 || bscale->dim(0) != E_loc || bscale->dim(1) != N || bscale->dim(2) != nb ||
        bscale->nbytes() != static_cast<size_t>(E_loc) * N * nb)
      throw Error("CUDA experts: " + nm + "_weight_scale has shape " + str(bscale->shape()) + ", expected [" +
                  std::to_string(E_loc) + ", " + std::to_string(N) + ", " + std::to_string(nb) + "] of bytes");
  }
  d.epi.assign(static_cast<size_t>(E_loc), 1.0f);
  std::vector<int> shift(static_cast<size_t>(E_loc), 0);  // MXFP4: c per expert (frag_layout.h)
  std::vector<uint8_t> buf(static_cast<size_t>(d.expert_stride));
  for (int e = 0; e < E_loc; ++e) {
    std::fill(buf.begin(), buf.end(), uint8_t{0});
    const uint8_t* src = w.data_as<uint8_t>() + int64_t{e} * N * src_row;
    if (fp4_fragment_layout(f)) {
      const uint8_t* esc = bscale->data_as<uint8_t>() + int64_t{e} * N * nb;
      const std::string what = nm + "_weight_scale of local expert " + std::to_string(e);
      if (f == WFmt::MXFP4) {
        auto nonzero = [&](int n, int b) {
          const uint8_t* blk = src + int64_t{n} * (K / 2) + b * (kMxBlock / 2);
          for (int i = 0; i < kMxBlock / 2; ++i)
            if (blk[i] & 0x77) return true;
          return false;
        };
        shift[e] = mx_shift(esc, N, nb, 126, 5, nonzero, what);
        d.epi[e] = std::ldexp(1.0f, shift[e]);
      } else {
        for (int64_t i = 0; i < int64_t{N} * nb; ++i)
          if ((esc[i] & 0x7F) == 0x7F)
            throw Error("CUDA experts: " + what + " holds an FP8 NaN block scale at row " + std::to_string(i / nb) +
                        ", block " + std::to_string(i % nb));
        d.epi[e] = kNvfp4EpilogueScale;
      }
      repack_fp4_fragments(src, f == WFmt::NVFP4 ? esc : nullptr, nb, N, K, d.Npad / kBW, d.Kt, buf.data());
    } else if (fp6_fragment_layout(f)) {
      const bool e3m2 = f == WFmt::MXFP6_E3M2;
      const uint8_t* esc = bscale->data_as<uint8_t>() + int64_t{e} * N * nb;
      auto nonzero = [&](int n, int b) {
        const uint8_t* row = src + n * src_row;
        for (int i = 0; i < kMxBlock; ++i)
          if (fp6_code_at(row, int64_t{b} * kMxBlock + i) & 0x1F) return true;
        return false;
      };
      const int bias = e3m2 ? Fp6Planes<true>::kBias : Fp6Planes<false>::kBias;
      const int margin = e3m2 ? Fp6Planes<true>::kMargin : Fp6Planes<false>::kMargin;
      shift[e] = mx_shift(esc, N, nb, bias, margin, nonzero, nm + "_weight_scale of local expert " + std::to_string(e));
      d.epi[e] = std::ldexp(1.0f, shift[e]);
      repack_fp6_fragments(src, e3m2, N, K, d.Npad / kBW, d.Kt, buf.data());
    } else if (fp8_fragment_layout(f)) {
      repack_fp8_fragments(src, N, K, d.Npad / kBW, d.Kt, buf.data());
    } else {  // BF16 / INT8: tile-major rows, 16-byte chunks swizzled (sw128_chunk)
      for (int n = 0; n < N; ++n) {
        const int nt = n / kBW, r = n % kBW;
        for (int kt = 0; kt < d.Kt; ++kt) {
          const int64_t b0 = kt * sb, len = std::min<int64_t>(sb, src_row - b0);
          if (len <= 0) break;
          uint8_t* row = buf.data() + ((int64_t{nt} * d.Kt + kt) * kBW + r) * sb;
          for (int q = 0; q * 16 < len; ++q)
            std::memcpy(row + sw128_chunk(r, q) * 16, src + int64_t{n} * src_row + b0 + q * 16,
                        static_cast<size_t>(std::min<int64_t>(16, len - q * 16)));
        }
      }
    }
    QMOE_CUDA_CHECK(cudaMemcpy(d.w.as<uint8_t>() + e * d.expert_stride, buf.data(), buf.size(), cudaMemcpyHostToDevice));
  }
  if (spb > 0) {
    // Regroup per 64-K stage: [Kt][Npad][spb], so one stage of 128 rows is contiguous.
    d.sc_expert_stride = int64_t{d.Kt} * d.Npad * spb;
    d.scales.alloc(static_cast<size_t>(d.sc_expert_stride) * E_loc);
    std::vector<uint8_t> sbuf(static_cast<size_t>(d.sc_expert_stride));
    const uint8_t* src = bscale->data_as<uint8_t>();
    for (int e = 0; e < E_loc; ++e) {
      std::fill(sbuf.begin(), sbuf.end(), uint8_t{0});
      for (int kt = 0; kt < d.Kt; ++kt)
        for (int n = 0; n < N; ++n)
          for (int j = 0; j < spb; ++j) {
            const int b = kt * spb + j;
            if (b >= nb) continue;
            uint8_t v = src[(int64_t{e} * N + n) * nb + b];
            if (f == WFmt::MXFP4 || f == WFmt::MXFP6_E2M3) v = mx_fp4_scale_byte(v, shift[e]);  // kernel form
            else if (f == WFmt::MXFP6_E3M2) v = mx_fp4_scale_byte(v, shift[e], Fp6Planes<true>::kBias);
            else if (f == WFmt::NVFP4) v = (v & 0x7F) == 0 ? uint8_t{0} : nvfp4_scale_byte(v);
            sbuf[(static_cast<size_t>(kt) * d.Npad + n) * spb + j] = v;
          }
      QMOE_CUDA_CHECK(cudaMemcpy(d.scales.as<uint8_t>() + e * d.sc_expert_stride, sbuf.data(), sbuf.size(),
                                 cudaMemcpyHostToDevice));
    }
  }
  if (colscale) {
    if (!colscale->defined() || colscale->dtype() != DType::F32 || colscale->ndim() != 2 ||
        colscale->dim(0) != E_loc || colscale->dim(1) != N)
      throw Error("CUDA experts: per-channel " + nm + "_weight_scale has shape " +
                  (colscale->defined() ? str(colscale->shape()) : std::string("(missing)")) + ", expected F32 [" +
                  std::to_string(E_loc) + ", " + std::to_string(N) + "]");
    d.colscale.alloc(sizeof(float) * E_loc * d.Npad);
    QMOE_CUDA_CHECK(cudaMemcpy2D(d.colscale.get(), sizeof(float) * d.Npad, colscale->data(), sizeof(float) * N,
                                 sizeof(float) * N, E_loc, cudaMemcpyHostToDevice));
  }
  if (bias && bias->defined()) {
    if (bias->numel() != int64_t{E_loc} * N)
      throw Error("CUDA experts: " + nm + "_bias has shape " + str(bias->shape()) + ", expected [" +
                  std::to_string(E_loc) + ", " + std::to_string(N) + "]");
    const std::vector<float> b = to_f32(*bias, nm + "_bias");  // F32 / BF16 / F16 → fp32 (exact)
    d.bias.alloc(sizeof(float) * E_loc * N, false);
    QMOE_CUDA_CHECK(cudaMemcpy(d.bias.get(), b.data(), sizeof(float) * E_loc * N, cudaMemcpyHostToDevice));
  }
}

// Unquantized weights stored as F16 / F32 are rounded to bf16 for the tensor cores (exact only
// for BF16 checkpoints, which is what Quark leaves excluded layers in).
Tensor as_bf16(const Tensor& w) {
  if (!w.defined() || w.dtype() == DType::BF16) return w;
  const std::vector<float> v = to_f32(w, "unquantized expert weight");
  Tensor t = Tensor::zeros(DType::BF16, w.shape());
  uint16_t* d = t.mutable_data_as<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) d[i] = bf16_encode(v[i]);
  return t;
}

// Per-expert fp32 factor of a projection: weight per-tensor / NVFP4 global scale × static
// activation scale (or 1/gs for NVFP4 activations).
std::vector<float> expert_factors(const ExpertParams& p, const Tensor& wscale, const Tensor& wscale2, float a_static,
                                  const char* name) {
  const SchemeInfo& s = *p.scheme;
  std::vector<float> f(static_cast<size_t>(p.num_local), 1.0f);
  const std::string nm = name;
  if (s.weight_scale == WeightScale::PerTensor) {
    if (!wscale.defined() || wscale.dtype() != DType::F32 || wscale.numel() != p.num_local)
      throw Error("CUDA experts: per-tensor " + nm + "_weight_scale must be F32 [" + std::to_string(p.num_local) +
                  "] after processing, found " + (wscale.defined() ? str(wscale.shape()) : std::string("(missing)")) +
                  " (run process_expert_params first)");
    for (int e = 0; e < p.num_local; ++e) f[e] = wscale.data_as<float>()[e];
  } else if (s.weight_scale == WeightScale::Nvfp4) {
    if (!wscale2.defined() || wscale2.dtype() != DType::F32 || wscale2.numel() != p.num_local)
      throw Error("CUDA experts: " + nm + "_weight_scale_2 must be F32 [" + std::to_string(p.num_local) +
                  "] after processing, found " + (wscale2.defined() ? str(wscale2.shape()) : std::string("(missing)")));
    for (int e = 0; e < p.num_local; ++e) f[e] = wscale2.data_as<float>()[e];
  }
  switch (s.act) {
    case ActQuant::Fp8Static:
    case ActQuant::Int8Static:
      for (auto& v : f) v *= a_static;
      break;
    case ActQuant::Nvfp4:
      for (auto& v : f) v = v / a_static;  // the operand holds e2m1·s_b; x̂ = that / gs
      break;
    default: break;
  }
  return f;
}

}  // namespace

CudaExperts::CudaExperts() : impl_(std::make_unique<Impl>()) {}
CudaExperts::~CudaExperts() = default;
CudaExperts::CudaExperts(CudaExperts&&) noexcept = default;
CudaExperts& CudaExperts::operator=(CudaExperts&&) noexcept = default;

// The row kernels (input quantization, activation) hold one fp32 row of H / I values in shared
// memory: a clear error for a layer wider than the device allows, not a failed launch later.
static void check_row_sizes(const CudaExperts::Impl& m) {
  const int64_t widest = std::max(m.H, m.I);
  if (widest * static_cast<int64_t>(sizeof(float)) > m.smem_optin)
    throw Error("CUDA experts: hidden size H=" + std::to_string(m.H) + " / intermediate size I=" + std::to_string(m.I) +
                " is too wide: the row kernels keep one fp32 row in shared memory, and this device allows " +
                std::to_string(m.smem_optin) + " bytes per block (H, I ≤ " + std::to_string(m.smem_optin / 4) + ")");
}

// A CudaOptions choice that is -1: environment variable `env`, value i spelled names[i] (unset or
// empty: dflt); any other spelling is an error listing `expected`.
static int env_choice(const char* env, std::initializer_list<const char*> names, int dflt, const char* expected) {
  const char* v = std::getenv(env);
  if (v == nullptr || *v == '\0') return dflt;
  int i = 0;
  for (const char* n : names) {
    if (std::strcmp(v, n) == 0) return i;
    ++i;
  }
  throw Error(std::string(env) + "='" + v + "': expected " + expected);
}

// CudaOptions::fp8_kernel: -1 reads env QMOE_CUDA_F8 (wg | ws1 | ws2; unset: ws2).
static int resolve_fp8_kernel(int k) {
  if (k < -1 || k > 2) throw Error("CUDA experts: fp8_kernel must be -1, 0, 1 or 2, got " + std::to_string(k));
  return k >= 0 ? k : env_choice("QMOE_CUDA_F8", {"wg", "ws1", "ws2"}, 2, "wg, ws1 or ws2");
}

static int resolve_tma(int t) {
  if (t < -1 || t > 4) throw Error("CUDA experts: tma must be -1 … 4, got " + std::to_string(t));
  return t >= 0 ? t : env_choice("QMOE_CUDA_TMA", {"0", "1", "all", "128", "all128"}, 1, "0, 1, all, 128 or all128");
}

static int resolve_persist(int p) {
  if (p < -1) throw Error("CUDA experts: persist must be -1, 0, 1 or a CTA count ≥ 2, got " + std::to_string(p));
  return p >= 0 ? p : env_choice("QMOE_CUDA_PERSIST", {"0", "1"}, 1, "0 or 1");
}

static void init_common(CudaExperts::Impl& m, const SchemeInfo& s, const ActivationSpec& act, const CudaOptions& opt) {
  QMOE_CUDA_CHECK(cudaSetDevice(opt.device));
  m.scheme = &s;
  m.opt = opt;
  m.wf = wfmt_of(s.weight);
  m.wgmma = opt.wgmma && wgmma_available();
  m.fp8_mma = opt.fp8_mma && m.wf == WFmt::FP8 && m.wgmma;
  // The warp-specialised form with two weight tiles per CTA by default: 1.14-1.50x gemm_wg_f8_kernel
  // at T = 1024 / 4096 (bench/RESULTS.md, 2026-12-04); CudaExperts.Fp8TensorCoreMode (all three
  // kernels) passed with test_cuda 310 / 310 and under compute-sanitizer memcheck on 2026-12-05.
  m.f8_kernel = resolve_fp8_kernel(opt.fp8_kernel);
  m.tma_mode = resolve_tma(opt.tma);
  m.persist = resolve_persist(opt.persist);
  const bool int8_w = s.weight == WeightFormat::Int8;
  const bool int8_a = s.act == ActQuant::Int8Static || s.act == ActQuant::Int8DynToken;
  if (int8_w != int8_a)
    throw Error("CUDA experts: scheme " + std::string(s.name) + " mixes INT8 and non-INT8 weights/activations");
  if (s.weight == WeightFormat::Fp8E4M3 && s.act != ActQuant::Fp8Static && s.act != ActQuant::Fp8DynToken &&
      s.act != ActQuant::Fp8DynTensor)
    throw Error("CUDA experts: scheme " + std::string(s.name) + ": FP8 weights need FP8 activations");
  if (s.weight == WeightFormat::Nvfp4 && s.act != ActQuant::Nvfp4)
    throw Error("CUDA experts: scheme " + std::string(s.name) + ": NVFP4 weights need NVFP4 activations");
  m.af = int8_w ? AFmt::Int8 : (s.act == ActQuant::None && !opt.bf16_activations) ? AFmt::Bf16Split : AFmt::Bf16;
  m.act.kind = act.kind;
  m.act.interleaved = act.interleaved;
  m.act.alpha = act.alpha;
  m.act.has_limit = act.limit.has_value();
  m.act.limit = act.limit.value_or(0.0f);
  int dev_sms = 0;
  QMOE_CUDA_CHECK(cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, opt.device));
  QMOE_CUDA_CHECK(cudaDeviceGetAttribute(&m.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, opt.device));
  m.num_sms = dev_sms > 0 ? dev_sms : 132;
  if (opt.token_tile != 0 && !is_token_tile(opt.token_tile))
    throw Error("CUDA experts: token_tile must be 0, 8, 16, 32, 64 or 128, got " + std::to_string(opt.token_tile));
  if (opt.ksplit < 0 || opt.ksplit > kMaxSplit)
    throw Error("CUDA experts: ksplit must be in [0, " + std::to_string(kMaxSplit) + "], got " + std::to_string(opt.ksplit));
}

CudaExperts::CudaExperts(const ExpertParams& p, const CudaOptions& opt) : impl_(std::make_unique<Impl>()) {
  if (!p.scheme) throw Error("CUDA experts: ExpertParams has no scheme");
  if (!p.processed)
    throw Error("CUDA experts: ExpertParams of scheme " + std::string(p.scheme->name) +
                " are not processed (call process_expert_params first)");
  const SchemeInfo& s = *p.scheme;
  Impl& m = *impl_;
  init_common(m, s, p.act, opt);
  m.E = p.num_experts;
  m.E_loc = p.num_local;
  m.H = p.hidden;
  m.I = p.inter;
  m.mx_mode = p.act_scale_mode;
  if (m.E_loc <= 0 || m.E_loc > kMaxLocalExperts || m.E < m.E_loc || m.H <= 0 || m.I <= 0)
    throw Error("CUDA experts: bad sizes E=" + std::to_string(m.E) + " E_loc=" + std::to_string(m.E_loc) +
                " H=" + std::to_string(m.H) + " I=" + std::to_string(m.I) + " (E_loc ≤ " +
                std::to_string(kMaxLocalExperts) + ")");
  check_row_sizes(m);
  const int blk = weight_block_size(s.weight);
  if (blk > 0 && (m.H % blk != 0 || m.I % blk != 0))
    throw Error("CUDA experts: " + std::string(s.name) + " needs H and I multiples of " + std::to_string(blk) +
                ", got H=" + std::to_string(m.H) + " I=" + std::to_string(m.I));
  if ((s.weight == WeightFormat::Mxfp6E2M3 || s.weight == WeightFormat::Mxfp6E3M2) && (m.H % 4 || m.I % 4))
    throw Error("CUDA experts: FP6 packing needs H and I multiples of 4");
  // Expert map (global → local), identity when absent.
  std::vector<int32_t> map(static_cast<size_t>(m.E));
  if (p.expert_map.empty()) {
    if (m.E != m.E_loc) throw Error("CUDA experts: expert_map is empty but E != E_loc");
    for (int e = 0; e < m.E; ++e) map[e] = e;
  } else {
    if (static_cast<int>(p.expert_map.size()) != m.E)
      throw Error("CUDA experts: expert_map has " + std::to_string(p.expert_map.size()) + " entries, expected E=" +
                  std::to_string(m.E));
    for (int e = 0; e < m.E; ++e) {
      const int v = p.expert_map[e];
      if (v < -1 || v >= m.E_loc)
        throw Error("CUDA experts: expert_map[" + std::to_string(e) + "] = " + std::to_string(v) + " is outside [-1, " +
                    std::to_string(m.E_loc) + ")");
      map[e] = v;
    }
  }
  m.expert_map.alloc(sizeof(int32_t) * m.E, false);
  QMOE_CUDA_CHECK(cudaMemcpy(m.expert_map.get(), map.data(), sizeof(int32_t) * m.E, cudaMemcpyHostToDevice));

  const bool per_channel = s.weight_scale == WeightScale::PerChannel;
  const Tensor w13 = m.wf == WFmt::BF16 ? as_bf16(p.w13_weight) : p.w13_weight;
  const Tensor w2 = m.wf == WFmt::BF16 ? as_bf16(p.w2_weight) : p.w2_weight;
  upload_projection(p, w13, &p.w13_weight_scale, per_channel ? &p.w13_weight_scale : nullptr, &p.w13_bias,
                    m.wf, 2 * m.I, m.H, "w13", m.w13);
  upload_projection(p, w2, &p.w2_weight_scale, per_channel ? &p.w2_weight_scale : nullptr, &p.w2_bias, m.wf,
                    m.H, m.I, "w2", m.w2);
  // Static activation scales (dequant direction; NVFP4: quantization-direction gs).
  m.a13 = p.a13_scale;
  m.a2 = p.a2_scale;
  if (act_is_static(s.act) && !(m.a13 > 0.0f && m.a2 > 0.0f && std::isfinite(m.a13) && std::isfinite(m.a2)))
    throw Error("CUDA experts: scheme " + std::string(s.name) + " needs positive static activation scales, found a13=" +
                std::to_string(m.a13) + " a2=" + std::to_string(m.a2));
  auto f13 = expert_factors(p, p.w13_weight_scale, p.w13_weight_scale_2, m.a13, "w13");
  auto f2 = expert_factors(p, p.w2_weight_scale, p.w2_weight_scale_2, m.a2, "w2");
  for (int e = 0; e < m.E_loc; ++e) {
    f13[e] *= m.w13.epi[e];
    f2[e] *= m.w2.epi[e];
  }
  m.w13.escale.alloc(sizeof(float) * m.E_loc, false);
  m.w2.escale.alloc(sizeof(float) * m.E_loc, false);
  QMOE_CUDA_CHECK(cudaMemcpy(m.w13.escale.get(), f13.data(), sizeof(float) * m.E_loc, cudaMemcpyHostToDevice));
  QMOE_CUDA_CHECK(cudaMemcpy(m.w2.escale.get(), f2.data(), sizeof(float) * m.E_loc, cudaMemcpyHostToDevice));
}

CudaExperts CudaExperts::random(const SchemeInfo& s, int num_experts, int hidden, int inter, const ActivationSpec& act,
                                uint64_t seed, const CudaOptions& opt, const std::vector<int>& expert_map) {
  CudaExperts ce;
  Impl& m = *ce.impl_;
  init_common(m, s, act, opt);
  m.E = num_experts;
  m.H = hidden;
  m.I = inter;
  if (m.E <= 0 || m.H <= 0 || m.I <= 0 || m.H % 64 || m.I % 64)
    throw Error("CUDA experts (random): need E > 0 and H, I multiples of 64");
  check_row_sizes(m);
  std::vector<int32_t> map(static_cast<size_t>(m.E));
  if (expert_map.empty()) {
    for (int e = 0; e < m.E; ++e) map[e] = e;
    m.E_loc = m.E;
  } else {
    if (static_cast<int>(expert_map.size()) != m.E)
      throw Error("CUDA experts (random): expert_map has " + std::to_string(expert_map.size()) + " entries, expected E=" +
                  std::to_string(m.E));
    m.E_loc = 0;
    for (int e = 0; e < m.E; ++e) {
      map[e] = expert_map[static_cast<size_t>(e)];
      if (map[e] >= 0) ++m.E_loc;
    }
    for (int e = 0; e < m.E; ++e)
      if (map[e] >= m.E_loc) throw Error("CUDA experts (random): expert_map is not a map onto 0..E_loc-1");
  }
  if (m.E_loc <= 0 || m.E_loc > kMaxLocalExperts)
    throw Error("CUDA experts (random): need 0 < E_loc <= " + std::to_string(kMaxLocalExperts));
  m.expert_map.alloc(sizeof(int32_t) * m.E, false);
  QMOE_CUDA_CHECK(cudaMemcpy(m.expert_map.get(), map.data(), sizeof(int32_t) * m.E, cudaMemcpyHostToDevice));
  uint64_t sd = seed * 1000003ull;
  auto fill_proj = [&](DevWeights& d, int N, int K) {
    d.N = N;
    d.K = K;
    d.Npad = static_cast<int>(round_up(N, kBW));
    d.Kpad = static_cast<int>(round_up(K, stage_k(m.wf)));  // the padding holds random values too: harmless,
    d.Kt = d.Kpad / stage_k(m.wf);                           // the activation operand is zero there
    d.row_bytes = packed_row_bytes(m.wf, d.Kpad);
    d.expert_stride = d.row_bytes * d.Npad;
    d.w.alloc(static_cast<size_t>(d.expert_stride) * m.E_loc, false);
    const int64_t n = d.expert_stride * m.E_loc;
    // Element magnitude ~ 1/sqrt(K) so that the intermediate stays O(1).
    const float amp = 1.0f / std::sqrt(static_cast<float>(K));
    switch (m.wf) {
      case WFmt::BF16: launch_random_fill(d.w.get(), n / 2, RandKind::Bf16Values, ++sd, -2 * amp, 2 * amp, nullptr); break;
      case WFmt::FP8: launch_random_fill(d.w.get(), n, RandKind::Fp8Codes, ++sd, 0, 0, nullptr); break;
      default: launch_random_fill(d.w.get(), n, RandKind::Bytes, ++sd, 0, 0, nullptr); break;
    }
    const int spb = scale_bytes_per_stage(m.wf);
    if (spb > 0) {
      d.sc_expert_stride = int64_t{d.Kt} * d.Npad * spb;
      d.scales.alloc(static_cast<size_t>(d.sc_expert_stride) * m.E_loc, false);
      if (m.wf == WFmt::NVFP4) {
        launch_random_fill(d.scales.get(), d.sc_expert_stride * m.E_loc, RandKind::Nvfp4KernelScales, ++sd, 0.5f, 2.0f,
                           nullptr);
      } else {
        // E8M0 bytes c ± 1 (shift 0), stored in kernel form s + 126 (FP4, E2M3) / 124 (E3M2).
        const float c = 127.0f + std::round(std::log2(amp / 2.5f)) + (m.wf == WFmt::MXFP6_E3M2 ? 124.0f : 126.0f);
        launch_random_fill(d.scales.get(), d.sc_expert_stride * m.E_loc, RandKind::E8M0Scales, ++sd, c - 1, c + 1, nullptr);
      }
    }
    if (s.weight_scale == WeightScale::PerChannel) {
      d.colscale.alloc(sizeof(float) * m.E_loc * d.Npad, false);
      launch_random_fill(d.colscale.get(), int64_t{m.E_loc} * d.Npad, RandKind::F32Values, ++sd, 0.5f * amp / 64,
                         1.5f * amp / 64, nullptr);
    }
    std::vector<float> f(static_cast<size_t>(m.E_loc), 1.0f);
    if (s.weight_scale == WeightScale::PerTensor) std::fill(f.begin(), f.end(), amp / 64);
    if (s.weight_scale == WeightScale::Nvfp4)
      std::fill(f.begin(), f.end(), amp / 2.5f * 672.0f / 4.0f * kNvfp4EpilogueScale);
    d.escale.alloc(sizeof(float) * m.E_loc, false);
    QMOE_CUDA_CHECK(cudaMemcpy(d.escale.get(), f.data(), sizeof(float) * m.E_loc, cudaMemcpyHostToDevice));
  };
  fill_proj(m.w13, 2 * m.I, m.H);
  fill_proj(m.w2, m.H, m.I);
  m.a13 = m.a2 = s.act == ActQuant::Nvfp4 ? 672.0f : s.act == ActQuant::Int8Static ? 1.0f / 64 : 1.0f / 128;
  QMOE_CUDA_CHECK(cudaDeviceSynchronize());
  return ce;
}

int CudaExperts::Impl::choose_split(int64_t ctas, int Kt, int TK) const {
  int ks = opt.ksplit;
  if (ks == 0) {
    const int64_t want = (2 * static_cast<int64_t>(num_sms) + ctas - 1) / std::max<int64_t>(ctas, 1);
    ks = static_cast<int>(std::min<int64_t>(want, kMaxSplit));
    ks = std::min(ks, std::max(1, Kt / 4));
  }
  ks = std::max(1, std::min(ks, Kt));
  ks = std::max(1, std::min(ks, cap_rows / std::max(TK, 1)));
  const int kps = (Kt + ks - 1) / ks;
  return (Kt + kps - 1) / kps;  // no empty split
}

CudaExperts::Impl::Plan CudaExperts::Impl::plan(int T, int K) const {
  Plan pl;
  const int TK = T * K;
  const int active = std::max(1, std::min(TK, E_loc));
  const double avg = static_cast<double>(TK) / active;
  // Token tile from the mean tokens per active expert (the measured table in gemm_wgmma_host.h).
  // An expert with more tokens than the tile streams its weights once per tile; the 16-token
  // groups of a tile past its expert's count cost no copies and no MMAs on the mma.sync kernel,
  // but a larger tile still costs shared memory (fewer stages, fewer CTAs per SM).
  const int bt = token_tile_for(wf, avg, wgmma, af == AFmt::Bf16Split);
  pl.bt = opt.token_tile ? opt.token_tile : bt;
  pl.max_tiles = std::min(TK, E_loc) + (TK + pl.bt - 1) / pl.bt;
  const int64_t est_tiles = std::max<int64_t>(active, (TK + pl.bt - 1) / pl.bt);
  pl.ks1 = choose_split(est_tiles * (w13.Npad / kBW), w13.Kt, TK);
  pl.ks2 = choose_split(est_tiles * (w2.Npad / kBW), w2.Kt, TK);
  pl.kps1 = (w13.Kt + pl.ks1 - 1) / pl.ks1;
  pl.kps2 = (w2.Kt + pl.ks2 - 1) / pl.ks2;
  return pl;
}

void CudaExperts::reserve(int max_tokens, int top_k) {
  Impl& m = *impl_;
  if (max_tokens <= 0 || top_k <= 0) throw Error("CUDA experts: reserve needs max_tokens > 0 and top_k > 0");
  if (max_tokens <= m.max_T && top_k <= m.max_K) return;
  m.max_T = std::max(max_tokens, m.max_T);
  m.max_K = std::max(top_k, m.max_K);
  const int64_t TK = int64_t{m.max_T} * m.max_K;
  m.cap_rows = static_cast<int>(std::max<int64_t>(TK, std::min<int64_t>(kMaxSplit * TK, 1024)));
  const int64_t max_tiles = std::min<int64_t>(TK, m.E_loc) + (TK + 7) / 8;  // smallest token tile: 8
  m.slot_local.alloc(sizeof(int32_t) * TK);
  m.sorted_slots.alloc(sizeof(int32_t) * TK);
  m.slot_pos.alloc(sizeof(int32_t) * TK);
  m.counts.alloc(sizeof(int32_t) * m.E_loc);
  m.offsets.alloc(sizeof(int32_t) * (m.E_loc + 1));
  m.tile_expert.alloc(sizeof(int32_t) * max_tiles);
  m.tile_m0.alloc(sizeof(int32_t) * max_tiles);
  m.num_tiles.alloc(3 * sizeof(int32_t));  // the tile count and GEMM1's / GEMM2's work counters
  m.bad.alloc(sizeof(int32_t) * m.max_T);
  const int eb = m.a_elem_bytes();
  const bool split = m.af == AFmt::Bf16Split;
  m.a1_hi.alloc(static_cast<size_t>(m.max_T) * m.w13.Kpad * eb);
  if (split) m.a1_lo.alloc(static_cast<size_t>(m.max_T) * m.w13.Kpad * eb);
  m.a1_scale.alloc(sizeof(float) * m.max_T);
  m.a2_hi.alloc(static_cast<size_t>(TK) * m.w2.Kpad * eb);
  if (split) m.a2_lo.alloc(static_cast<size_t>(TK) * m.w2.Kpad * eb);
  m.a2_scale.alloc(sizeof(float) * TK);
  if (m.fp8_mma) {
    m.a1_e8.alloc(static_cast<size_t>(m.max_T) * m.w13.Kpad);
    m.a2_e8.alloc(static_cast<size_t>(TK) * m.w2.Kpad);
  }
  m.y1p.alloc(sizeof(float) * m.cap_rows * static_cast<size_t>(2 * m.I), false);
  m.y2p.alloc(sizeof(float) * m.cap_rows * static_cast<size_t>(m.H), false);
  if (m.scheme->act == ActQuant::Fp8DynTensor) m.zbuf.alloc(sizeof(float) * TK * static_cast<size_t>(m.I), false);
  m.amax.alloc(2 * sizeof(unsigned));
  // Last, so that the buffers above keep the addresses they had without them.
  m.tma_rows = 0;
  if (m.wgmma && TK >= 128 && m.tma_mode > 0) {
    m.tma_rows = static_cast<int>(TK);
    if (m.tma_gather1()) {
      m.a1s_hi.alloc(static_cast<size_t>(TK) * m.w13.Kpad * eb, false);
      if (split) m.a1s_lo.alloc(static_cast<size_t>(TK) * m.w13.Kpad * eb, false);
    }
    m.a2s_hi.alloc(static_cast<size_t>(TK) * m.w2.Kpad * eb);  // zeroed: the act kernels never write the K padding
    if (split) m.a2s_lo.alloc(static_cast<size_t>(TK) * m.w2.Kpad * eb);
  }
}

void CudaExperts::run_device(const float* d_x, int T, int K, const int32_t* d_topk_ids, const float* d_topk_weights,
                             float* d_out, bool router_weight_on_input, bool accumulate, void* stream) const {
  run_device(d_x, DType::F32, T, K, d_topk_ids, d_topk_weights, d_out, router_weight_on_input, accumulate, stream);
}

void CudaExperts::run_device(const void* d_x, DType x_dtype, int T, int K, const int32_t* d_topk_ids,
                             const float* d_topk_weights, float* d_out, bool router_weight_on_input, bool accumulate,
                             void* stream) const {
  Impl& m = *impl_;
  XType xt = XType::F32;
  switch (x_dtype) {
    case DType::F32: xt = XType::F32; break;
    case DType::BF16: xt = XType::BF16; break;
    case DType::F16: xt = XType::F16; break;
    default:
      throw Error("CUDA experts: hidden states must be F32, BF16 or F16, got " + std::string(dtype_name(x_dtype)));
  }
  if (T <= 0) return;
  if (K <= 0 || T > m.max_T || int64_t{T} * K > int64_t{m.max_T} * m.max_K)
    throw Error("CUDA experts: run with T=" + std::to_string(T) + " K=" + std::to_string(K) +
                " exceeds the reserved T=" + std::to_string(m.max_T) + " K=" + std::to_string(m.max_K) +
                " (call reserve first)");
  if (router_weight_on_input && K != 1)
    throw Error("CUDA experts: router_weight_on_input needs top_k == 1, got " + std::to_string(K));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const SchemeInfo& sc = *m.scheme;
  const int TK = T * K;
  const Impl::Plan pl = m.plan(T, K);

  AlignArgs al;
  al.topk_ids = d_topk_ids;
  al.expert_map = m.expert_map.as<int32_t>();
  al.TK = TK;
  al.E = m.E;
  al.E_loc = m.E_loc;
  al.bt = pl.bt;
  al.slot_local = m.slot_local.as<int32_t>();
  al.counts = m.counts.as<int32_t>();
  al.offsets = m.offsets.as<int32_t>();
  al.sorted_slots = m.sorted_slots.as<int32_t>();
  al.slot_pos = m.slot_pos.as<int32_t>();
  al.tile_expert = m.tile_expert.as<int32_t>();
  al.tile_m0 = m.tile_m0.as<int32_t>();
  al.num_tiles = m.num_tiles.as<int32_t>();
  al.debug_delay_ns = align_debug_delay_ns();
  al.warp_rank = TK <= kWarpAlignSlots && warp_align_enabled();
  unsigned* amax = m.amax.as<unsigned>();
  const bool dyn_tensor = sc.act == ActQuant::Fp8DynTensor;
  // Decode without a tensor-wide input scale: align and the input quantization in one launch.
  const bool fuse_prep = !dyn_tensor && T < kFusedPrepMaxRows && fused_prep_enabled();
  // Otherwise, with nothing between them, the input quantization runs beside align (after_align):
  // it lets its dependants start before align has completed (launch.cuh).
  const bool beside_align = !fuse_prep && !dyn_tensor;
  if (!fuse_prep) launch_align(al, s);

  const bool rowscale = is_dyn_rowscale(sc.act);
  // FP8 on the e4m3 tensor cores: the tiles of the e4m3 wgmma kernel (gemm_fp8.cu).
  const bool e8 = m.fp8_mma && (pl.bt == 64 || pl.bt == 128);
  // A bf16 input is its own hi part: GEMM1 runs on one MMA (the lo part would be zeros).
  const AFmt af1 = e8 ? AFmt::E4m3 : (m.af == AFmt::Bf16Split && xt == XType::BF16) ? AFmt::Bf16 : m.af;
  const AFmt af2 = e8 ? AFmt::E4m3 : m.af;
  RowQuant q1;
  q1.mode = sc.act;
  q1.mx_mode = m.mx_mode;
  q1.split = af1 == AFmt::Bf16Split;
  q1.f16 = m.wf == WFmt::FP8;
  q1.e4m3 = e8;
  q1.static_scale = m.a13;
  q1.tensor_amax = amax;
  RowQuant q2 = q1;
  q2.split = af2 == AFmt::Bf16Split;
  q2.static_scale = m.a2;
  q2.tensor_amax = amax + 1;
  if (dyn_tensor) {
    QMOE_CUDA_CHECK(cudaMemsetAsync(amax, 0, 2 * sizeof(unsigned), s));
    launch_absmax_input(d_x, xt, T, m.H, d_topk_weights, K, router_weight_on_input, amax, s);
  }
  const int eb = e8 ? 1 : m.a_elem_bytes();
  const DevBuf& a1 = e8 ? m.a1_e8 : m.a1_hi;
  const DevBuf& a2 = e8 ? m.a2_e8 : m.a2_hi;
  RowOut o1{a1.get(), m.a1_lo.get(), m.a1_scale.as<float>(), m.w13.Kpad};
  if (fuse_prep)
    launch_prep(al, d_x, xt, T, m.H, d_topk_weights, K, router_weight_on_input, q1, o1, m.bad.as<int32_t>(),
                m.smem_optin, s);
  else  // (with a tensor-wide scale, absmax_input runs between align and this launch)
    launch_quant_input(d_x, xt, T, m.H, d_topk_weights, K, router_weight_on_input, q1, o1, m.bad.as<int32_t>(),
                       beside_align, s);

  auto gemm_args = [&](const DevWeights& d, const DevBuf& ahi, const DevBuf& alo, const DevBuf& ascale, int row_div,
                       float* out, int kps) {
    GemmArgs g;
    g.w = d.w.as<uint8_t>();
    g.w_expert_stride = d.expert_stride;
    g.w_row_bytes = d.row_bytes;
    g.wscale = d.scales.as<uint8_t>();
    g.ws_expert_stride = d.sc_expert_stride;
    g.colscale = d.colscale.as<float>();
    g.escale = d.escale.as<float>();
    g.a_hi = ahi.get();
    g.a_lo = alo.get();
    g.a_row_bytes = int64_t{d.Kpad} * eb;
    g.a_rowscale = rowscale ? ascale.as<float>() : nullptr;
    g.a_row_div = row_div;
    g.sorted_slots = m.sorted_slots.as<int32_t>();
    g.offsets = m.offsets.as<int32_t>();
    g.counts = m.counts.as<int32_t>();
    g.tile_expert = m.tile_expert.as<int32_t>();
    g.tile_m0 = m.tile_m0.as<int32_t>();
    g.num_tiles = m.num_tiles.as<int32_t>();
    g.out = out;
    g.N = d.N;
    g.Npad = d.Npad;
    g.TK = TK;
    g.Kt = d.Kt;
    g.kt_per_split = kps;
    g.f8_kernel = m.f8_kernel;
    g.fit_n = fit_n_enabled();
    g.persist = m.persist == 1 ? m.num_sms : m.persist;
    return g;
  };
  // 128-token tiles on the warp-specialised kernel read their activation tiles by TMA from a copy
  // of the operand in tile order (GemmArgs::a_tma): GEMM2's written so by the activation kernel
  // (RowOut::row_map), GEMM1's by a gather of the quantized rows where its cost (a pass over T · K
  // rows of H, twice with the hi + lo split) is small next to the GEMM's: N = 2I ≥ kTmaGatherMinN.
  // Measured on an H100 (bench/RESULTS.md 2026-12-05 night, against no TMA, T = 256 / 1024 /
  // 4096): mixtral-8x7b 1.06–1.24x at T >= 1024 on every scheme; gpt-oss-120b and deepseek-v3
  // 1.04–1.13x at T = 4096 on the 4-bit, INT8 and FP8 schemes; qwen3-30b-a3b (2I = 1536)
  // 0.94–0.97x at T = 4096 with GEMM1 gathered too, 0.99–1.03x with this rule. 64-token tiles
  // (the split hi + lo schemes' prefill tile) take the same path: H200 2026-12-06, mixtral-8x7b
  // w_mxfp4 / MXFP6 W6A16 1.10–1.18x at T = 256…4096, gpt-oss-120b w_mxfp4 1.04x at T = 4096, the
  // 128-token-tile schemes level.
  auto use_tma = [&](AFmt af) {  // tma_rows > 0: reserved on the wgmma kernels
    const bool tile_ok = pl.bt == 128 || (pl.bt == 64 && m.tma_tile64());
    return m.tma_rows >= TK && tile_ok && ws_tma_built(m.wf, af, pl.bt) && (af != AFmt::E4m3 || m.f8_kernel > 0);
  };
  auto set_tma = [&](GemmArgs& g, const DevWeights& d, AFmt af, const DevBuf& shi, const DevBuf& slo, bool gather) {
    const int64_t rb = int64_t{d.Kpad} * eb;
    if (gather)
      launch_gather_rows(g.a_hi, af == AFmt::Bf16Split ? g.a_lo : nullptr, rb, g.sorted_slots, g.a_row_div,
                         g.offsets + m.E_loc, TK, shi.get(), af == AFmt::Bf16Split ? slo.get() : nullptr, s);
    g.a_tma = true;
    g.tma_hi = make_rows_tmap(shi.get(), TK, rb, pl.bt);
    if (af == AFmt::Bf16Split) g.tma_lo = make_rows_tmap(slo.get(), TK, rb, pl.bt);
  };
  GemmArgs g1 = gemm_args(m.w13, a1, m.a1_lo, m.a1_scale, K, m.y1p.as<float>(), pl.kps1);
  g1.claim = m.num_tiles.as<int32_t>() + 1;
  const bool gather1 = use_tma(af1) && m.tma_gather1();
  // GEMM1 reads the tile lists before its pdl_wait only where align had completed when the kernel
  // just before GEMM1 started (launch.cuh): not after launch_prep (align is in that grid), nor right
  // after the quantization beside align (a gather in between waits for it first).
  g1.tiles_after_wait = fuse_prep || (beside_align && !gather1);
  if (gather1) set_tma(g1, m.w13, af1, m.a1s_hi, m.a1s_lo, true);
  launch_gemm(m.wf, af1, pl.bt, m.wgmma, g1, dim3(pl.max_tiles, m.w13.Npad / kBW, pl.ks1), s);

  const bool tma2 = use_tma(af2);
  RowOut o2{a2.get(), m.a2_lo.get(), m.a2_scale.as<float>(), m.w2.Kpad};
  if (tma2) {
    o2.a_hi = m.a2s_hi.get();
    o2.a_lo = m.a2s_lo.get();
    o2.row_map = m.slot_pos.as<int32_t>();
  }
  launch_act(m.y1p.as<float>(), pl.ks1, TK, m.I, m.slot_local.as<int32_t>(), m.w13.bias.as<float>(), m.act, q2, o2,
             dyn_tensor, m.zbuf.as<float>(), amax + 1, m.num_sms, s);
  if (dyn_tensor) launch_quant_rows(m.zbuf.as<float>(), TK, m.I, m.slot_local.as<int32_t>(), q2, o2, s);

  GemmArgs g2 = gemm_args(m.w2, a2, m.a2_lo, m.a2_scale, 1, m.y2p.as<float>(), pl.kps2);
  g2.claim = m.num_tiles.as<int32_t>() + 2;
  if (tma2) set_tma(g2, m.w2, af2, m.a2s_hi, m.a2s_lo, false);
  launch_gemm(m.wf, af2, pl.bt, m.wgmma, g2, dim3(pl.max_tiles, m.w2.Npad / kBW, pl.ks2), s);

  launch_combine(m.y2p.as<float>(), pl.ks2, T, K, m.H, m.slot_local.as<int32_t>(), d_topk_weights,
                 router_weight_on_input, m.w2.bias.as<float>(), d_out, accumulate, m.bad.as<int32_t>(), s);
}

void CudaExperts::run_host(const ExpertsArgs& a) const {
  Impl& m = *impl_;
  if (a.T < 0 || a.K <= 0) throw Error("CUDA experts: bad T=" + std::to_string(a.T) + " K=" + std::to_string(a.K));
  if (a.T == 0) return;
  if (!a.x || !a.topk_ids || !a.topk_weights || !a.out) throw Error("CUDA experts: ExpertsArgs has a null pointer");
  check_experts_inputs(a, "experts_cuda");  // non-finite inputs are refused (docs/DECISIONS.md)
  for (int64_t i = 0; i < int64_t{a.T} * a.K; ++i)
    if (a.topk_ids[i] < 0 || a.topk_ids[i] >= m.E)
      throw Error("CUDA experts: topk_ids[" + std::to_string(i / a.K) + ", " + std::to_string(i % a.K) + "] = " +
                  std::to_string(a.topk_ids[i]) + " is outside [0, " + std::to_string(m.E) + ")");
  const_cast<CudaExperts*>(this)->reserve(a.T, a.K);
  const size_t xb = sizeof(float) * a.T * static_cast<size_t>(m.H);
  const size_t kb = static_cast<size_t>(a.T) * a.K;
  if (a.T > m.h_T || a.K > m.h_K) {
    m.h_T = std::max(a.T, m.h_T);
    m.h_K = std::max(a.K, m.h_K);
    m.h_x.alloc(sizeof(float) * m.h_T * static_cast<size_t>(m.H), false);
    m.h_out.alloc(sizeof(float) * m.h_T * static_cast<size_t>(m.H), false);
    m.h_ids.alloc(sizeof(int32_t) * m.h_T * static_cast<size_t>(m.h_K), false);
    m.h_w.alloc(sizeof(float) * m.h_T * static_cast<size_t>(m.h_K), false);
  }
  QMOE_CUDA_CHECK(cudaMemcpy(m.h_x.get(), a.x, xb, cudaMemcpyHostToDevice));
  QMOE_CUDA_CHECK(cudaMemcpy(m.h_out.get(), a.out, xb, cudaMemcpyHostToDevice));
  QMOE_CUDA_CHECK(cudaMemcpy(m.h_ids.get(), a.topk_ids, sizeof(int32_t) * kb, cudaMemcpyHostToDevice));
  QMOE_CUDA_CHECK(cudaMemcpy(m.h_w.get(), a.topk_weights, sizeof(float) * kb, cudaMemcpyHostToDevice));
  run_device(m.h_x.as<float>(), a.T, a.K, m.h_ids.as<int32_t>(), m.h_w.as<float>(), m.h_out.as<float>(),
             a.router_weight_on_input, true, nullptr);
  QMOE_CUDA_CHECK(cudaGetLastError());
  QMOE_CUDA_CHECK(cudaDeviceSynchronize());
  QMOE_CUDA_CHECK(cudaMemcpy(a.out, m.h_out.get(), xb, cudaMemcpyDeviceToHost));
}

int CudaExperts::hidden() const { return impl_->H; }
int CudaExperts::inter() const { return impl_->I; }
int CudaExperts::num_experts() const { return impl_->E; }
int CudaExperts::num_local() const { return impl_->E_loc; }
const SchemeInfo& CudaExperts::scheme() const { return *impl_->scheme; }
double CudaExperts::expert_bytes() const {
  const Impl& m = *impl_;
  double b = 3.0 * m.H * m.I * m.scheme->bits_per_weight / 8.0;
  if (m.scheme->weight_scale == WeightScale::PerChannel) b += (2.0 * m.I + m.H) * 4.0;
  return b;
}

void launch_gemm(WFmt wf, AFmt af, int bt, bool wg, const GemmArgs& a, dim3 grid, cudaStream_t s) {
  switch (wf) {
    case WFmt::BF16: launch_gemm_bf16(af, bt, wg, a, grid, s); break;
    case WFmt::FP8: launch_gemm_fp8(af, bt, wg, a, grid, s); break;
    case WFmt::INT8: launch_gemm_int8(af, bt, wg, a, grid, s); break;
    case WFmt::MXFP4: launch_gemm_mxfp4(af, bt, wg, a, grid, s); break;
    case WFmt::MXFP6_E2M3:
    case WFmt::MXFP6_E3M2: launch_gemm_mxfp6(wf, af, bt, wg, a, grid, s); break;
    case WFmt::NVFP4: launch_gemm_nvfp4(af, bt, wg, a, grid, s); break;
  }
}

void experts_cuda(const ExpertsArgs& a, const CudaOptions& opt) {
  if (!a.params) throw Error("experts_cuda: ExpertsArgs.params is null");
  CudaExperts ce(*a.params, opt);
  ce.run_host(a);
}

}  // namespace qmoe::cuda
