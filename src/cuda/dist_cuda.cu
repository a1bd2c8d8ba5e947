// CudaDistributedMoE (qmoe/cuda_dist.h): qmoe/dist.h's algorithm with device buffers — the host
// plans the dispatch from the downloaded top-k ids, small kernels pack the rows to send and sum the
// returned partials in rank order, the communicator moves the bytes, CudaExperts computes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_common.h"
#include "dist/in_process.h"
#include "qmoe/cuda_dist.h"
#include "qmoe/error.h"

namespace qmoe::cuda {

namespace {

// Row i of the send buffers ← token rows[i]: the hidden state (row_words 32-bit or 16-bit words)
// and its K ids and weights.
template <class W>
__global__ void pack_rows_kernel(const W* __restrict__ x, int row_words, const int32_t* __restrict__ ids,
                                 const float* __restrict__ w, int K, const int32_t* __restrict__ rows, W* __restrict__ xs,
                                 int32_t* __restrict__ is, float* __restrict__ ws) {
  const int i = blockIdx.x;
  const int64_t t = rows[i];
  for (int j = threadIdx.x; j < row_words; j += blockDim.x)
    xs[static_cast<int64_t>(i) * row_words + j] = x[t * row_words + j];
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    is[static_cast<int64_t>(i) * K + k] = ids[t * K + k];
    ws[static_cast<int64_t>(i) * K + k] = w[t * K + k];
  }
}

// out[t] = Σ_r back[back_row[t, r]] in rank order (rows of H fp32).
__global__ void combine_ranks_kernel(const float* __restrict__ back, const int32_t* __restrict__ back_row, int R, int H,
                                     float* __restrict__ out) {
  const int t = blockIdx.x;
  const int32_t* br = back_row + static_cast<int64_t>(t) * R;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < R; ++r) {
      const int32_t row = br[r];
      if (row >= 0) acc += back[static_cast<int64_t>(row) * H + h];
    }
    out[static_cast<int64_t>(t) * H + h] = acc;
  }
}

// The one shared expert's id 0 and weight 1 per token (the gate, if any, overwrites the weights).
__global__ void shared_ones_kernel(int T, float* w, int32_t* ids) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T) {
    w[t] = 1.0f;
    ids[t] = 0;
  }
}

size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

void device_copy(void* dst, const void* src, size_t bytes) {
  QMOE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}
void device_sync(void* stream) { QMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

}  // namespace

std::vector<std::unique_ptr<dist::Communicator>> device_in_process_group(int n) {
  dist::MemoryOps ops;
  ops.device = true;
  ops.copy = device_copy;
  ops.sync = device_sync;
  return dist::make_in_process_group(n, ops);
}

struct CudaDistributedMoE::Impl {
  Impl(const std::string& dir, int layer_index, dist::Communicator& e, dist::Communicator& t,
       const dist::DistOptions& o, const CudaOptions& copt)
      : layer(dist::load_rank_layer(dir, layer_index, e, t, o)), ep(e), tp(t), opt(o), device(copt.device) {
    guarded([&] {
      QMOE_CUDA_CHECK(cudaSetDevice(device));
      experts.emplace(layer->experts(), copt);
      if (layer->shared_expert()) {
        shared.emplace(*layer->shared_expert(), copt);
        if (layer->shared_gate().defined()) {
          const std::vector<float> g = to_f32(layer->shared_gate(), "shared_expert_gate weight");
          QMOE_CUDA_CHECK(cudaMemcpy(gate.need<float>(g.size()), g.data(), g.size() * sizeof(float),
                                     cudaMemcpyHostToDevice));
          has_gate = true;
        }
      }
      init(layer->config().num_experts, layer->config().top_k, layer->config().routing.apply_router_weight_on_input);
    });
  }
  Impl(CudaExperts&& ex, int top_k, bool rw_on_input, dist::Communicator& e, dist::Communicator& t,
       const dist::DistOptions& o, int dev)
      : ep(e), tp(t), opt(o), device(dev) {
    guarded([&] {
      experts.emplace(std::move(ex));
      init(experts->num_experts(), top_k, rw_on_input);
    });
  }

  template <class F> void guarded(F f) {
    try {
      f();
    } catch (const std::exception& ex) {
      ep.abort(ex.what());
      tp.abort(ex.what());
      throw;
    }
  }

  void init(int num_experts, int top_k, bool rw_on_input) {
    if (!ep.device_memory() || !tp.device_memory())
      throw Error("CudaDistributedMoE needs communicators of device buffers; the " +
                  (!ep.device_memory() ? ep.name() : tp.name()) +
                  " one holds host buffers (use qmoe::dist::DistributedMoE, or cuda::device_in_process_group)");
    if (ep.size() != opt.ep || tp.size() != opt.tp)
      throw Error("CudaDistributedMoE: the EP group has " + std::to_string(ep.size()) + " ranks and the TP group " +
                  std::to_string(tp.size()) + ", but ep = " + std::to_string(opt.ep) + " and tp = " +
                  std::to_string(opt.tp));
    dist::validate_layout(opt, num_experts);
    E = num_experts;
    K = top_k;
    H = experts->hidden();
    rwoi = rw_on_input;
    owner = dist::expert_owners(E, opt.ep);
  }

  void reserve_experts(int rows) {
    if (rows > experts_rows) {
      experts->reserve(rows, K);
      experts_rows = rows;
    }
  }

  void forward(const void* d_x, DType dt, int T, const int32_t* d_ids, const float* d_w, float* d_out,
               cudaStream_t s) {
    if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
      throw Error("CudaDistributedMoE: hidden states must be F32, BF16 or F16, got " + std::string(dtype_name(dt)));
    if (T < 0) throw Error("CudaDistributedMoE: token count T = " + std::to_string(T) + " is negative");
    QMOE_CUDA_CHECK(cudaSetDevice(device));
    const size_t row_bytes = static_cast<size_t>(H) * dtype_bytes(dt);
    last_bytes = 0;
    if (opt.ep == 1) {
      if (T > 0) {
        reserve_experts(T);
        experts->run_device(d_x, dt, T, K, d_ids, d_w, d_out, rwoi, false, s);
      }
    } else {
      // The plan from the routing: one download, one host round trip for the sizes.
      h_ids.resize(static_cast<size_t>(T) * K);
      if (T > 0)
        QMOE_CUDA_CHECK(cudaMemcpyAsync(h_ids.data(), d_ids, h_ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
      QMOE_CUDA_CHECK(cudaStreamSynchronize(s));
      dist::DispatchPlan p = dist::plan_dispatch(h_ids.data(), T, K, owner, opt.ep, opt.dispatch);
      p.exchange_counts(ep, s);
      const int R = opt.ep;
      const auto S = static_cast<size_t>(p.rows_out()), N = static_cast<size_t>(p.rows_in());
      auto* rows = d_rows.need<int32_t>(S);
      auto* brow = d_back_row.need<int32_t>(p.back_row.size());
      if (S) QMOE_CUDA_CHECK(cudaMemcpyAsync(rows, p.send_tokens.data(), S * sizeof(int32_t), cudaMemcpyHostToDevice, s));
      if (!p.back_row.empty())
        QMOE_CUDA_CHECK(cudaMemcpyAsync(brow, p.back_row.data(), p.back_row.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, s));
      void* xs = xs_.need(S * row_bytes);
      auto* is = is_.need<int32_t>(S * K);
      auto* ws = ws_.need<float>(S * K);
      void* xr = xr_.need(N * row_bytes);
      auto* ir = ir_.need<int32_t>(N * K);
      auto* wr = wr_.need<float>(N * K);
      auto* part = part_.need<float>(N * H);
      auto* back = back_.need<float>(S * H);
      if (S) {
        const int threads = 256;
        if (row_bytes % 4 == 0)
          pack_rows_kernel<uint32_t><<<static_cast<unsigned>(S), threads, 0, s>>>(
              static_cast<const uint32_t*>(d_x), static_cast<int>(row_bytes / 4), d_ids, d_w, K, rows,
              static_cast<uint32_t*>(xs), is, ws);
        else
          pack_rows_kernel<uint16_t><<<static_cast<unsigned>(S), threads, 0, s>>>(
              static_cast<const uint16_t*>(d_x), static_cast<int>(row_bytes / 2), d_ids, d_w, K, rows,
              static_cast<uint16_t*>(xs), is, ws);
        QMOE_CUDA_CHECK(cudaGetLastError());
      }
      auto exchange = [&](const void* send, void* recv, size_t rb, const std::vector<int64_t>& srows,
                          const std::vector<int64_t>& rrows) {
        dist::DispatchPlan::byte_spans(srows, rb, so, sb);
        dist::DispatchPlan::byte_spans(rrows, rb, ro, rbb);
        ep.all_to_all_v(send, so.data(), sb.data(), recv, ro.data(), rbb.data(), s);
        for (int r = 0; r < R; ++r)
          if (r != ep.rank()) last_bytes += static_cast<int64_t>(sb[static_cast<size_t>(r)]);
      };
      exchange(xs, xr, row_bytes, p.send_offset, p.recv_offset);
      exchange(is, ir, K * sizeof(int32_t), p.send_offset, p.recv_offset);
      exchange(ws, wr, K * sizeof(float), p.send_offset, p.recv_offset);
      if (N) {
        reserve_experts(static_cast<int>(N));
        experts->run_device(xr, dt, static_cast<int>(N), K, ir, wr, part, rwoi, false, s);
      }
      exchange(part, back, H * sizeof(float), p.recv_offset, p.send_offset);
      if (T > 0) {
        combine_ranks_kernel<<<static_cast<unsigned>(T), 256, 0, s>>>(back, brow, R, H, d_out);
        QMOE_CUDA_CHECK(cudaGetLastError());
      }
    }
    // The shared expert on this rank's own tokens.
    if (shared && T > 0) {
      if (T > shared_rows) {
        shared->reserve(T, 1);
        shared_rows = T;
      }
      auto* sw = sw_.need<float>(static_cast<size_t>(T));
      auto* sid = sid_.need<int32_t>(static_cast<size_t>(T));
      shared_ones_kernel<<<static_cast<unsigned>((T + 255) / 256), 256, 0, s>>>(T, sw, sid);
      QMOE_CUDA_CHECK(cudaGetLastError());
      // The gate's weights sigmoid(x·g) (the same kernel as CudaLayer's router logits).
      if (has_gate) router_logits_device(d_x, dt, T, H, gate.as<float>(), nullptr, 1, true, sw, s);
      shared->run_device(d_x, dt, T, 1, sid, sw, d_out, false, true, s);
    }
    if (opt.tp > 1) {
      tp.all_reduce_sum(d_out, static_cast<size_t>(T) * H, s);
      last_bytes += static_cast<int64_t>(static_cast<size_t>(T) * H * sizeof(float));
    }
  }

  std::optional<MoELayer> layer;  // from a checkpoint (forward_host routes with it)
  dist::Communicator& ep;
  dist::Communicator& tp;
  dist::DistOptions opt;
  int device = 0;
  std::optional<CudaExperts> experts, shared;
  GrowBuf host_x, host_ids, host_w, host_out;  // forward_host's staging
  GrowBuf gate, d_rows, d_back_row, xs_, is_, ws_, xr_, ir_, wr_, part_, back_, sw_, sid_;
  bool has_gate = false, rwoi = false;
  int E = 0, K = 0, H = 0;
  int experts_rows = 0, shared_rows = 0;
  std::vector<int> owner;
  std::vector<int32_t> h_ids;
  std::vector<size_t> so, sb, ro, rbb;
  int64_t last_bytes = 0;
};

CudaDistributedMoE::CudaDistributedMoE(const std::string& dir, int layer, dist::Communicator& ep_comm,
                                       dist::Communicator& tp_comm, const dist::DistOptions& o,
                                       const CudaOptions& opt)
    : impl_(std::make_unique<Impl>(dir, layer, ep_comm, tp_comm, o, opt)) {}

CudaDistributedMoE::~CudaDistributedMoE() = default;

CudaDistributedMoE::CudaDistributedMoE(CudaExperts experts, int top_k, bool router_weight_on_input,
                                       dist::Communicator& ep_comm, dist::Communicator& tp_comm,
                                       const dist::DistOptions& o, int device)
    : impl_(std::make_unique<Impl>(std::move(experts), top_k, router_weight_on_input, ep_comm, tp_comm, o, device)) {}

const MoELayer& CudaDistributedMoE::layer() const {
  if (!impl_->layer) throw Error("CudaDistributedMoE::layer: built from CudaExperts, not from a checkpoint");
  return *impl_->layer;
}
int64_t CudaDistributedMoE::last_bytes_sent() const { return impl_->last_bytes; }

void CudaDistributedMoE::forward_device(const void* d_x, DType x_dtype, int T, const int32_t* d_topk_ids,
                                        const float* d_topk_weights, float* d_out, void* stream) {
  try {
    impl_->forward(d_x, x_dtype, T, d_topk_ids, d_topk_weights, d_out, static_cast<cudaStream_t>(stream));
  } catch (const std::exception& e) {
    impl_->ep.abort(e.what());
    impl_->tp.abort(e.what());
    throw;
  }
}

void CudaDistributedMoE::forward_host(const float* x, const float* router_logits, int T, MoEWorkspace& ws,
                                      float* out) {
  Impl& m = *impl_;
  if (!m.layer) throw Error("CudaDistributedMoE::forward_host needs a layer loaded from a checkpoint (it routes)");
  const int H = m.H, K = m.K;
  try {
    dist::route_rank_tokens(*m.layer, x, router_logits, T, out, ws, "CudaDistributedMoE::forward_host");
  } catch (const std::exception& e) {
    m.ep.abort(e.what());
    m.tp.abort(e.what());
    throw;
  }
  QMOE_CUDA_CHECK(cudaSetDevice(m.device));
  const size_t n = static_cast<size_t>(T) * H, nk = static_cast<size_t>(T) * K;
  // Staging reused across calls (forward_device's own buffers are separate).
  float* px = m.host_x.need<float>(n);
  int32_t* pi = m.host_ids.need<int32_t>(nk);
  float* pw = m.host_w.need<float>(nk);
  float* po = m.host_out.need<float>(n);
  if (T > 0) {
    QMOE_CUDA_CHECK(cudaMemcpy(px, x, n * sizeof(float), cudaMemcpyHostToDevice));
    QMOE_CUDA_CHECK(cudaMemcpy(pi, ws.topk_ids.data(), nk * sizeof(int32_t), cudaMemcpyHostToDevice));
    QMOE_CUDA_CHECK(cudaMemcpy(pw, ws.topk_weights.data(), nk * sizeof(float), cudaMemcpyHostToDevice));
  }
  forward_device(px, DType::F32, T, pi, pw, po, nullptr);
  if (T > 0) QMOE_CUDA_CHECK(cudaMemcpy(out, po, n * sizeof(float), cudaMemcpyDeviceToHost));
  QMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace qmoe::cuda
