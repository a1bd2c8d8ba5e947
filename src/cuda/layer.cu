// CudaLayer: a whole MoE layer on one GPU (router logits → device routing → routed experts →
// shared expert), and the router-logits kernel it uses.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_common.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"

namespace qmoe::cuda {

namespace {

// ---- router logits -----------------------------------------------------------------------------
// One block: kRT tokens × kRE experts (one warp per expert); the tokens' hidden states pass through
// shared memory kRH elements at a time. Each lane sums its strided share of fp32 products in fp64,
// then the warp adds the 32 partial sums in a fixed butterfly order: deterministic, and (fp64 sums
// of at most a few thousand fp32 products) equal to the host's fp64 sum (32 interleaved partial
// sums, src/moe/router_logits.cc) after rounding to fp32 except in rare near-ties.
constexpr int kRT = 8;
constexpr int kRE = 8;
constexpr int kRH = 512;

__device__ __forceinline__ float x_to_f32(float v) { return v; }
__device__ __forceinline__ float x_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float x_to_f32(__half v) { return __half2float(v); }

template <class XT>
__global__ void __launch_bounds__(kRE * 32) router_logits_kernel(const XT* __restrict__ x, int T, int H,
                                                                 const float* __restrict__ w,
                                                                 const float* __restrict__ bias, int E, bool sigm,
                                                                 float* __restrict__ out) {
  __shared__ float xs[kRT][kRH];
  const int t0 = blockIdx.x * kRT;
  const int nt = min(kRT, T - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.y * kRE + warp;
  const float* wr = w + static_cast<size_t>(min(e, E - 1)) * H;
  double acc[kRT];
#pragma unroll
  for (int r = 0; r < kRT; ++r) acc[r] = 0.0;
  for (int h0 = 0; h0 < H; h0 += kRH) {
    const int hn = min(kRH, H - h0);
    __syncthreads();
    for (int i = threadIdx.x; i < kRT * kRH; i += blockDim.x) {
      const int r = i / kRH, c = i % kRH;
      xs[r][c] = (r < nt && c < hn) ? x_to_f32(x[static_cast<size_t>(t0 + r) * H + h0 + c]) : 0.0f;
    }
    __syncthreads();
    if (e < E)
      for (int c = lane; c < hn; c += 32) {
        const float wv = wr[h0 + c];
#pragma unroll
        for (int r = 0; r < kRT; ++r)
          if (r < nt) acc[r] += static_cast<double>(__fmul_rn(xs[r][c], wv));
      }
  }
  if (e >= E) return;
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  if (lane != 0) return;
  for (int r = 0; r < nt; ++r) {
    double v = acc[r];
    if (bias) v += static_cast<double>(bias[e]);
    float f = static_cast<float>(v);
    if (sigm) f = 1.0f / (1.0f + expf(-f));
    out[static_cast<size_t>(t0 + r) * E + e] = f;
  }
}

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    QMOE_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) QMOE_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

float* upload_f32(GrowBuf& b, const std::vector<float>& v) {
  float* p = b.need<float>(v.size());
  if (!v.empty()) QMOE_CUDA_CHECK(cudaMemcpy(p, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

void router_logits_device(const void* d_x, DType x_dtype, int T, int H, const float* d_w, const float* d_bias, int E,
                          bool sigmoid, float* d_logits, void* stream) {
  if (T < 0 || H < 1 || E < 1)
    throw Error("router_logits_device: bad sizes T=" + std::to_string(T) + " H=" + std::to_string(H) +
                " E=" + std::to_string(E));
  if (T == 0) return;
  if (!d_x || !d_w || !d_logits) throw Error("router_logits_device: null device pointer");
  if ((E + kRE - 1) / kRE > 65535)  // grid.y (grid.x = ⌈T / 8⌉ always fits)
    throw Error("router_logits_device: E=" + std::to_string(E) + " exceeds the grid limit of " +
                std::to_string(65535 * kRE) + " experts");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid((T + kRT - 1) / kRT, (E + kRE - 1) / kRE);
  switch (x_dtype) {
    case DType::F32:
      router_logits_kernel<<<grid, kRE * 32, 0, s>>>(static_cast<const float*>(d_x), T, H, d_w, d_bias, E, sigmoid,
                                                     d_logits);
      break;
    case DType::BF16:
      router_logits_kernel<<<grid, kRE * 32, 0, s>>>(static_cast<const __nv_bfloat16*>(d_x), T, H, d_w, d_bias, E,
                                                     sigmoid, d_logits);
      break;
    case DType::F16:
      router_logits_kernel<<<grid, kRE * 32, 0, s>>>(static_cast<const __half*>(d_x), T, H, d_w, d_bias, E, sigmoid,
                                                     d_logits);
      break;
    default:
      throw Error("router_logits_device: hidden states must be F32, BF16 or F16, got " +
                  std::string(dtype_name(x_dtype)));
  }
  QMOE_CUDA_CHECK(cudaGetLastError());
}

// ---- CudaLayer ---------------------------------------------------------------------------------

struct CudaLayer::Impl {
  int device = 0, E = 0, H = 0, K = 0;
  RoutingConfig rc;
  bool on_input = false;
  bool has_router = false, has_bias = false, has_correction = false, has_gate = false;
  std::unique_ptr<CudaExperts> routed, shared;
  GrowBuf router_w, router_b, corr_b, gate_w;  // uploaded once
  GrowBuf logits, sh_ids, sh_w;                // per-call work, sized by reserve
  int max_T = 0;
  std::mutex mu;
  cudaEvent_t done = nullptr;  // recorded after each eager call, on `last`
  cudaStream_t last = nullptr;
  bool have_last = false;

  ~Impl() {
    if (done) cudaEventDestroy(done);
  }
};

CudaLayer::CudaLayer(const MoELayer& layer, const CudaOptions& opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (opt.device < 0 || opt.device >= device_count())
    throw Error("CudaLayer: device " + std::to_string(opt.device) + " is not visible (" +
                std::to_string(device_count()) + " CUDA device(s))");
  m.device = opt.device;
  DeviceGuard g(m.device);
  const ModelConfig& cfg = layer.config();
  m.E = layer.experts().num_experts;
  m.H = layer.experts().hidden;
  m.K = cfg.top_k;
  m.rc = cfg.routing;
  m.on_input = cfg.routing.apply_router_weight_on_input;
  validate_routing(m.rc, 1, m.E, m.K, layer.correction_bias().defined());
  m.routed = std::make_unique<CudaExperts>(layer.experts(), opt);
  if (layer.shared_expert() && layer.options().load.ep_rank == 0)
    m.shared = std::make_unique<CudaExperts>(*layer.shared_expert(), opt);
  if (layer.router_weight().defined()) {
    m.has_router = true;
    upload_f32(m.router_w, to_f32(layer.router_weight(), "router weight"));
    if (layer.router_bias().defined()) {
      m.has_bias = true;
      upload_f32(m.router_b, to_f32(layer.router_bias(), "router bias"));
    }
  }
  if (layer.correction_bias().defined()) {
    m.has_correction = true;
    upload_f32(m.corr_b, to_f32(layer.correction_bias(), "e_score_correction_bias"));
  }
  if (m.shared && layer.shared_gate().defined()) {
    m.has_gate = true;
    upload_f32(m.gate_w, to_f32(layer.shared_gate(), "shared_expert_gate weight"));
  }
  QMOE_CUDA_CHECK(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming));
}

CudaLayer::~CudaLayer() = default;
CudaLayer::CudaLayer(CudaLayer&&) noexcept = default;
CudaLayer& CudaLayer::operator=(CudaLayer&&) noexcept = default;

static void reserve_locked(CudaLayer::Impl& m, int max_tokens) {
  if (max_tokens <= m.max_T) return;
  DeviceGuard g(m.device);
  QMOE_CUDA_CHECK(cudaDeviceSynchronize());  // earlier calls may still use the buffers that grow
  m.routed->reserve(max_tokens, m.K);
  if (m.shared) m.shared->reserve(max_tokens, 1);
  if (m.has_router) m.logits.need<float>(static_cast<size_t>(max_tokens) * m.E);
  if (m.shared) {
    QMOE_CUDA_CHECK(cudaMemset(m.sh_ids.need<int32_t>(max_tokens), 0, sizeof(int32_t) * max_tokens));
    if (m.has_gate)
      m.sh_w.need<float>(max_tokens);  // the gate's sigmoid, written per call
    else
      upload_f32(m.sh_w, std::vector<float>(static_cast<size_t>(max_tokens), 1.0f));
  }
  m.max_T = max_tokens;
}

void CudaLayer::reserve(int max_tokens) {
  if (max_tokens < 1) throw Error("CudaLayer: reserve needs max_tokens >= 1, got " + std::to_string(max_tokens));
  std::lock_guard<std::mutex> lock(impl_->mu);
  reserve_locked(*impl_, max_tokens);
}

int CudaLayer::reserved_tokens() const { return impl_->max_T; }

void CudaLayer::run_device(const void* d_x, DType x_dtype, int T, const void* d_logits, DType logits_dtype,
                           float* d_out, int32_t* d_topk_ids, float* d_topk_weights, void* stream) const {
  Impl& m = *impl_;
  if (T < 1) throw Error("CudaLayer: T = " + std::to_string(T) + " tokens; expected T >= 1");
  if (!d_x || !d_out || !d_topk_ids || !d_topk_weights) throw Error("CudaLayer: null device pointer");
  if (!d_logits && !m.has_router)
    throw Error("CudaLayer: no router logits given and the layer has no router weight");
  std::lock_guard<std::mutex> lock(m.mu);
  DeviceGuard g(m.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  QMOE_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
  const bool capturing = cap != cudaStreamCaptureStatusNone;
  if (T > m.max_T) {
    if (capturing)
      throw Error("CudaLayer: a call with T = " + std::to_string(T) + " tokens inside a stream capture exceeds the " +
                  std::to_string(m.max_T) + " reserved; reserve(" + std::to_string(T) +
                  ") or run the layer once with that many tokens before capturing");
    reserve_locked(m, T);
  }
  if (!capturing && m.have_last && m.last != s) QMOE_CUDA_CHECK(cudaStreamWaitEvent(s, m.done, 0));

  const void* lp = d_logits;
  DType ldt = logits_dtype;
  if (!lp) {
    router_logits_device(d_x, x_dtype, T, m.H, m.router_w.as<float>(), m.has_bias ? m.router_b.as<float>() : nullptr,
                         m.E, false, m.logits.as<float>(), s);
    lp = m.logits.as<float>();
    ldt = DType::F32;
  }
  route_device(m.rc, lp, ldt, T, m.E, m.K, m.has_correction ? m.corr_b.as<float>() : nullptr, d_topk_ids,
               d_topk_weights, s);
  m.routed->run_device(d_x, x_dtype, T, m.K, d_topk_ids, d_topk_weights, d_out, m.on_input, false, s);
  if (m.shared) {
    if (m.has_gate)
      router_logits_device(d_x, x_dtype, T, m.H, m.gate_w.as<float>(), nullptr, 1, true, m.sh_w.as<float>(), s);
    m.shared->run_device(d_x, x_dtype, T, 1, m.sh_ids.as<int32_t>(), m.sh_w.as<float>(), d_out, false, true, s);
  }
  QMOE_CUDA_CHECK(cudaGetLastError());
  if (!capturing) {
    QMOE_CUDA_CHECK(cudaEventRecord(m.done, s));
    m.last = s;
    m.have_last = true;
  }
}

void CudaLayer::synchronize() const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.have_last) QMOE_CUDA_CHECK(cudaEventSynchronize(m.done));
}

int CudaLayer::device() const { return impl_->device; }
int CudaLayer::hidden() const { return impl_->H; }
int CudaLayer::num_experts() const { return impl_->E; }
int CudaLayer::top_k() const { return impl_->K; }
bool CudaLayer::has_router() const { return impl_->has_router; }
bool CudaLayer::has_shared_expert() const { return impl_->shared != nullptr; }
const CudaExperts& CudaLayer::experts() const { return *impl_->routed; }
const CudaExperts* CudaLayer::shared_expert() const { return impl_->shared.get(); }

}  // namespace qmoe::cuda
