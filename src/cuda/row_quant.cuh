// Block-cooperative row quantizers (the scheme's activation quantization, spec §9.1, §10.4–10.8),
// written with the formats.h functions so that they agree with the CPU reference bit for bit
// given the same fp32 inputs. A row of n values in shared memory becomes the GEMM operand:
//   None          bf16(v) (+ bf16(v − hi) when split)
//   MX fp4/fp6    quantize-dequantize per 32 (shared exponent from formats.h, "even" etc.), exact in bf16
//   NVFP4         e2m1 · s_b per 16 (exact in bf16); the 1/gs factor is applied after the GEMM
//   FP8           fp8 code values (exact in bf16 and fp16); s applied after the GEMM (rowscale / per expert)
//   INT8          int8 codes; s applied after the GEMM
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_common.h"
#include "cuda/qdq_fast.h"
#include "qmoe/formats.h"

namespace qmoe::cuda {

constexpr int kRowThreads = 512;  // one block per row; red[] below holds up to 32 warps

// max over aligned groups of `lanes` lanes (a power of two ≤ 32): every lane of a group gets it.
__device__ __forceinline__ float lanes_max(float v, int lanes) {
#pragma unroll
  for (int o = lanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ float warp_max(float v) { return lanes_max(v, 32); }

// max |v[i]| over the row, all threads of the block get it. `red` : 32 floats of shared memory.
__device__ __forceinline__ float block_absmax(const float* v, int n, float* red) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(v[i]));
  m = warp_max(m);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = m;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float r = lane < nw ? red[lane] : 0.0f;
  r = warp_max(r);
  return r;
}

// NVFP4 activation quantization of one 16-element block with max |x| = amax and global scale gs:
// the block scale s_b = e4m3(gs · amax / 6) (clamped to ±448), x → e2m1(x · gs / s_b) · s_b (the
// 1/gs factor is applied after the GEMM).
struct Nvfp4Block {
  float sb, inv;
  __device__ __forceinline__ Nvfp4Block(float amax, float gs) {
    float s = gs * amax / kFp4Max;
    s = fminf(fmaxf(s, -kFp8E4M3Max), kFp8E4M3Max);
    sb = minifloat_qdq<QdqFp8E4M3>(s);  // s is finite: clamped to ±448
    inv = sb == 0.0f ? 0.0f : gs / sb;
  }
  __device__ __forceinline__ float qdq(float x) const {
    const float qv = fminf(fmaxf(x * inv, -kFp4Max), kFp4Max);
    return minifloat_qdq<QdqFp4E2M1>(qv) * sb;
  }
};

// MX quantize-dequantize of a row, one warp per 32-element block (shared exponent from formats.h,
// elements through qdq_fast.h: bit-identical to mx_qdq_block).
template <class F>
__device__ __forceinline__ void mx_quantize_row(const float* v, int n, MxScaleMode mode, __nv_bfloat16* hi) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int nb = (n + kMxBlock - 1) / kMxBlock;
  for (int b = warp; b < nb; b += nw) {
    const int i = b * kMxBlock + lane;
    const float x = i < n ? v[i] : 0.0f;
    const float amax = warp_max(fabsf(x));
    const int sh = mx_shared_exponent(amax, F::kElem, mode);
    if (i < n) hi[i] = __float2bfloat16_rn(mx_qdq<F>(x, sh));
  }
}

// Quantize row `row` (values v[0..n) in shared memory) into o, from column col0 on (a chunk of the
// row: col0 a multiple of 32, so MX and NVFP4 blocks are whole; the per-token dynamic modes need
// the whole row, col0 = 0).
__device__ inline void quantize_row(const float* v, int n, const RowQuant& q, const RowOut& o, int64_t row, float* red,
                                    int col0 = 0) {
  const int64_t at = o.value_row(row) * o.stride + col0;
  __nv_bfloat16* hi = static_cast<__nv_bfloat16*>(o.a_hi) + at;
  __nv_bfloat16* lo = o.a_lo ? static_cast<__nv_bfloat16*>(o.a_lo) + at : nullptr;
  int8_t* i8 = static_cast<int8_t*>(o.a_hi) + at;
  const int tid = threadIdx.x;
  switch (q.mode) {
    case ActQuant::None:
      for (int i = tid; i < n; i += blockDim.x) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
        hi[i] = h;
        if (q.split) lo[i] = __float2bfloat16_rn(v[i] - __bfloat162float(h));
      }
      break;
    case ActQuant::Mxfp4: mx_quantize_row<QdqFp4E2M1>(v, n, q.mx_mode, hi); break;
    case ActQuant::Mxfp6E2M3: mx_quantize_row<QdqFp6E2M3>(v, n, q.mx_mode, hi); break;
    case ActQuant::Mxfp6E3M2: mx_quantize_row<QdqFp6E3M2>(v, n, q.mx_mode, hi); break;
    case ActQuant::Nvfp4: {
      const float gs = q.static_scale;
      const int warp = tid >> 5, lane = tid & 31, nw = blockDim.x >> 5;
      const int nb = (n + kNvfp4Block - 1) / kNvfp4Block;
      for (int b0 = warp * 2; b0 < nb; b0 += nw * 2) {  // a warp takes 2 blocks of 16
        const int b = b0 + (lane >> 4);
        const int i = b * kNvfp4Block + (lane & 15);
        const float x = (b < nb && i < n) ? v[i] : 0.0f;
        const Nvfp4Block blk(lanes_max(fabsf(x), kNvfp4Block), gs);
        if (b < nb && i < n) hi[i] = __float2bfloat16_rn(blk.qdq(x));
      }
      break;
    }
    case ActQuant::Fp8Static:
    case ActQuant::Fp8DynToken:
    case ActQuant::Fp8DynTensor: {
      float s;
      if (q.mode == ActQuant::Fp8Static) {
        s = q.static_scale;
      } else if (q.mode == ActQuant::Fp8DynToken) {
        s = fp8_token_scale(block_absmax(v, n, red));
      } else {
        s = fp8_tensor_scale(__uint_as_float(*q.tensor_amax));
      }
      const float inv = 1.0f / s;
      if (q.e4m3) {
        uint8_t* c8 = static_cast<uint8_t*>(o.a_hi) + at;  // col0 is a multiple of 16: whole chunks
        // Elements 2j, 2j + 1 are neighbours in the e4m3 order too: one 2-byte store per pair.
        for (int i = 2 * tid; i < n; i += 2 * blockDim.x) {
          if (i + 1 < n) *reinterpret_cast<uint16_t*>(c8 + e4m3_act_pos(i)) = e4m3x2_act_codes(v[i], v[i + 1], inv);
          else c8[e4m3_act_pos(i)] = e4m3_act_code(v[i], inv);
        }
      } else if (q.f16) {
        __half* h16 = static_cast<__half*>(o.a_hi) + at;
        for (int i = tid; i < n; i += blockDim.x) h16[i] = __float2half_rn(qdq_fp8_act(v[i], inv));
      } else {
        for (int i = tid; i < n; i += blockDim.x) hi[i] = __float2bfloat16_rn(qdq_fp8_act(v[i], inv));
      }
      if (q.mode != ActQuant::Fp8Static && tid == 0) o.rowscale[row] = s;
      break;
    }
    case ActQuant::Int8Static: {
      const float s = q.static_scale;
      for (int i = tid; i < n; i += blockDim.x) i8[i] = int8_quantize_static(v[i], s);
      break;
    }
    case ActQuant::Int8DynToken: {
      const float amax = block_absmax(v, n, red);
      const float inv = int8_token_inv_scale(amax);
      for (int i = tid; i < n; i += blockDim.x) i8[i] = int8_quantize_token(v[i], inv);
      if (tid == 0) o.rowscale[row] = int8_token_scale(amax);
      break;
    }
  }
}

}  // namespace qmoe::cuda
