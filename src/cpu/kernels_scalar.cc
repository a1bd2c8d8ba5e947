// Scalar kernels (no SIMD): the fallback ISA and the baseline the SIMD kernels are tested against.
// One weight row is decoded into a small buffer (never a whole matrix), then dotted with every
// token row; sums in double (I8 / Fp4 block sums in exact integers).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "cpu/kernel_iface.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe::cpu {

namespace {

// Decodes weight row n into `wf` (F32 kind, fp32 values with block scales, act value order) or
// into `wi` (integer kinds: int8 codes / 2·e2m1 values, act value order) + `wbs` (Fp4 block
// factors).
struct RowDecoder {
  const WeightView& w;
  const ActLayout& l;

  void decode_f32(int n, float* wf) const {
    const uint8_t* row = w.data + static_cast<int64_t>(n) * w.row_bytes;
    const int K = w.cols;
    switch (w.fmt) {
      case WeightFormat::BF16:
        for (int c = 0; c < K; ++c) {
          float v;
          if (w.dtype == DType::F32) std::memcpy(&v, row + 4 * c, 4);
          else {
            uint16_t h;
            std::memcpy(&h, row + 2 * c, 2);
            v = w.dtype == DType::BF16 ? bf16_decode(h) : fp16_decode(h);
          }
          wf[c] = v;
        }
        break;
      case WeightFormat::Fp8E4M3: {
        const float* t = fp8_e4m3_table();
        for (int c = 0; c < K; ++c) wf[c] = t[row[c]];
        break;
      }
      case WeightFormat::Int8:
        for (int c = 0; c < K; ++c) wf[c] = static_cast<float>(static_cast<int8_t>(row[c]));
        break;
      case WeightFormat::Mxfp4: {
        const uint8_t* sc = w.scales + static_cast<int64_t>(n) * (K / kMxBlock);
        const float* e8 = e8m0_table();
        for (int g = 0; g < K / 32; ++g) {
          const float s = e8[sc[g]];
          for (int j = 0; j < 16; ++j) {
            const uint8_t b = row[g * 16 + j];
            wf[act_value_position(l, g * 32 + 2 * j)] = fp4_e2m1_decode(b & 0xF) * s;
            wf[act_value_position(l, g * 32 + 2 * j + 1)] = fp4_e2m1_decode(b >> 4) * s;
          }
        }
        break;
      }
      case WeightFormat::Mxfp6E2M3:
      case WeightFormat::Mxfp6E3M2: {
        const uint8_t* sc = w.scales + static_cast<int64_t>(n) * (K / kMxBlock);
        const float* e8 = e8m0_table();
        for (int c = 0; c < K; ++c) {
          const uint8_t code = fp6_code_at(row, c);
          const float v = w.fmt == WeightFormat::Mxfp6E2M3 ? fp6_e2m3_decode(code) : fp6_e3m2_decode(code);
          wf[c] = v * e8[sc[c / kMxBlock]];
        }
        break;
      }
      case WeightFormat::Nvfp4: {
        const uint8_t* sc = w.scales + static_cast<int64_t>(n) * (K / kNvfp4Block);
        const float* f8 = fp8_e4m3_table();
        for (int g = 0; g * 32 < K; ++g)
          for (int j = 0; j < 16 && g * 32 + 2 * j < K; ++j) {
            const uint8_t b = row[g * 16 + j];
            const float factor = f8[sc[(g * 32 + 2 * j) / kNvfp4Block]] * w.nv_global;
            wf[act_value_position(l, g * 32 + 2 * j)] = fp4_e2m1_decode(b & 0xF) * factor;
            wf[act_value_position(l, g * 32 + 2 * j + 1)] = fp4_e2m1_decode(b >> 4) * factor;
          }
        break;
      }
    }
  }

  void decode_int(int n, int8_t* wi, double* wbs) const {
    const uint8_t* row = w.data + static_cast<int64_t>(n) * w.row_bytes;
    const int K = w.cols;
    if (l.kind == DotKind::I8) {
      std::memcpy(wi, row, static_cast<size_t>(K));
      return;
    }
    std::memset(wi, 0, static_cast<size_t>(l.k_pad));
    // The layout's integer weights: w_mult · element (2·e2m1 for MXFP4 / NVFP4, 8·e2m3 for MXFP6 E2M3).
    const bool fp6 = w.fmt == WeightFormat::Mxfp6E2M3;
    for (int i = 0; i < K; ++i) {
      const float e = fp6 ? fp6_e2m3_decode(fp6_code_at(row, i)) : fp4_e2m1_decode(fp4_code_at(row, i));
      wi[act_value_position(l, i)] = static_cast<int8_t>(static_cast<float>(l.w_mult) * e);
    }
    const int nb = l.nblocks;
    const uint8_t* sc = w.scales + static_cast<int64_t>(n) * nb;
    for (int b = 0; b < nb; ++b)
      wbs[b] = l.kind == DotKind::Fp4Mx ? static_cast<double>(e8m0_table()[sc[b]])
                                        : static_cast<double>(fp8_e4m3_table()[sc[b]] * w.nv_global);
  }
};

void gemm_scalar(const GemmArgs& a) {
  const WeightView& w = *a.w;
  const ActLayout& l = *a.layout;
  const int K = w.cols;
  thread_local std::vector<float> wf;
  thread_local std::vector<int8_t> wi;
  thread_local std::vector<double> wbs;
  thread_local std::vector<int> block_of_pos;
  const int KP = l.k_pad;
  wf.assign(static_cast<size_t>(KP), 0.0f);
  wi.assign(static_cast<size_t>(KP), 0);
  wbs.resize(static_cast<size_t>(l.nblocks) + 1);
  if (l.kind == DotKind::Fp4Mx || l.kind == DotKind::Fp4Nv) {
    block_of_pos.assign(static_cast<size_t>(KP), l.nblocks);
    for (int i = 0; i < K; ++i) block_of_pos[static_cast<size_t>(act_value_position(l, i))] = i / l.block;
  }
  const RowDecoder dec{w, l};
  std::vector<double> bsum(static_cast<size_t>(l.nblocks) + 1);
  for (int n = a.row0; n < a.row1; ++n) {
    const double wscale = w.channel_scale ? static_cast<double>(w.channel_scale[n]) : static_cast<double>(w.tensor_scale);
    const double bias = w.bias ? static_cast<double>(bias_value(w, n)) : 0.0;
    if (l.kind == DotKind::F32 || l.kind == DotKind::Bf16) dec.decode_f32(n, wf.data());
    else dec.decode_int(n, wi.data(), wbs.data());
    for (int j = 0; j < a.ntok; ++j) {
      const uint8_t* row = a.act_base + static_cast<int64_t>(a.act_index[j]) * l.stride;
      float rs;
      std::memcpy(&rs, row, 4);
      double dot = 0.0;
      switch (l.kind) {
        case DotKind::F32: {
          const float* v = reinterpret_cast<const float*>(row + l.vals_off);
          for (int i = 0; i < KP; ++i) dot += static_cast<double>(v[i]) * static_cast<double>(wf[static_cast<size_t>(i)]);
          break;
        }
        case DotKind::Bf16: {  // Σ over the terms: the fp32 values exactly
          const int32_t nt = bf16_term_count(row);
          for (int t = 0; t < nt; ++t) {
            const uint16_t* v = reinterpret_cast<const uint16_t*>(row + l.vals_off + t * l.term_bytes);
            for (int i = 0; i < KP; ++i)
              dot += static_cast<double>(bf16_decode(v[i])) * static_cast<double>(wf[static_cast<size_t>(i)]);
          }
          break;
        }
        case DotKind::I8: {
          const int8_t* v = reinterpret_cast<const int8_t*>(row + l.vals_off);
          int64_t acc = 0;
          for (int i = 0; i < K; ++i) acc += static_cast<int32_t>(v[i]) * static_cast<int32_t>(wi[static_cast<size_t>(i)]);
          dot = static_cast<double>(acc);
          break;
        }
        case DotKind::Fp4Mx:
        case DotKind::Fp4Nv: {
          const int8_t* v = reinterpret_cast<const int8_t*>(row + l.vals_off);
          const float* abs = reinterpret_cast<const float*>(row + l.scales_off);
          std::fill(bsum.begin(), bsum.end(), 0.0);
          for (int i = 0; i < KP; ++i)
            bsum[static_cast<size_t>(block_of_pos[static_cast<size_t>(i)])] +=
                static_cast<double>(static_cast<int32_t>(v[i]) * static_cast<int32_t>(wi[static_cast<size_t>(i)]));
          for (int b = 0; b < l.nblocks; ++b)
            dot += bsum[static_cast<size_t>(b)] * static_cast<double>(abs[b]) * wbs[static_cast<size_t>(b)];
          break;
        }
      }
      float y = static_cast<float>(dot * static_cast<double>(rs) * wscale + bias);
      if (a.post_mul) y *= a.post_mul[j];
      a.out[static_cast<int64_t>(j) * a.ldo + n] = y;
    }
  }
}

}  // namespace

void* thread_scratch_buffer(int slot, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t cap = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[4];
  Buf& b = bufs[slot & 3];
  if (bytes > b.cap) {
    std::free(b.p);
    b.cap = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, b.cap);
    if (b.p == nullptr) throw std::bad_alloc();
  }
  return b.p;
}

const KernelTable& scalar_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    k.isa = Isa::Scalar;
    k.quantize_row = quantize_row_scalar;
    k.gemm = gemm_scalar;
    k.activation_row = activation_row_scalar;
    k.abs_max = abs_max_scalar;
    return k;
  }();
  return t;
}

int64_t row_stream_distance() {
  static const int64_t d = cpu_features().near_row_prefetch ? 1024 : 4096;
  return d;
}

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return avx2_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx512Bf16: return avx512bf16_kernels();
    case Isa::Amx:
      // (isa_supported asks the OS for tile data once per process: without it a tile instruction faults)
      if (!isa_supported(Isa::Amx)) throw Error("kernel_table: the amx target is not supported by this CPU / OS");
      return amx_kernels();
    default: return scalar_kernels();
  }
}

}  // namespace qmoe::cpu
