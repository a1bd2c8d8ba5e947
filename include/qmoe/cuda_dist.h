// Expert / tensor parallelism on GPUs (qmoe/dist.h's algorithm with device buffers): NCCL
// communicators and one rank's share of an MoE layer resident on its GPU.
//
// One process driving all GPUs of a node: `nccl_communicators(devices)` gives one communicator per
// device; each rank is then driven by its own thread. Across processes: rank 0 makes
// `nccl_unique_id()`, hands the bytes to the others (any side channel), and every rank calls
// `nccl_communicator(id, n, rank, device)`. For EP × TP make one communicator per EP group and per
// TP group (qmoe::dist::RankLayout lists the members). Keep NVLink multicast off where the machine
// requires it (NCCL_NVLS_ENABLE=0).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "qmoe/cuda.h"
#include "qmoe/dist.h"

namespace qmoe::cuda {

// True when this qmoe was built with NCCL (QMOE_HAVE_NCCL).
bool nccl_available();
// The 128 bytes of a fresh ncclUniqueId. Without NCCL: qmoe::Error.
std::string nccl_unique_id();
std::unique_ptr<dist::Communicator> nccl_communicator(const std::string& unique_id, int nranks, int rank, int device);
// One communicator per listed device, all in one group (rank i on devices[i]).
std::vector<std::unique_ptr<dist::Communicator>> nccl_communicators(const std::vector<int>& devices);
// The in-process group over device memory of one GPU (device copies, host-side sums): a test
// double that runs the n-rank device algorithm on a single GPU. Slow; not for production.
std::vector<std::unique_ptr<dist::Communicator>> device_in_process_group(int n);

// One rank's share of an MoE layer on its GPU (the device of `opt.device`; the communicators hold
// device buffers of that device). Routing is the caller's (route_device, or host top-k uploaded).
class CudaDistributedMoE {
 public:
  CudaDistributedMoE(const std::string& dir, int layer, dist::Communicator& ep_comm, dist::Communicator& tp_comm,
                     const dist::DistOptions& o, const CudaOptions& opt = {});
  // This rank's experts already on the device (e.g. CudaExperts::random with this rank's
  // ep_expert_map, for benchmarks): no shared expert, no router; forward_device only.
  CudaDistributedMoE(CudaExperts experts, int top_k, bool router_weight_on_input, dist::Communicator& ep_comm,
                     dist::Communicator& tp_comm, const dist::DistOptions& o, int device = 0);
  ~CudaDistributedMoE();
  CudaDistributedMoE(const CudaDistributedMoE&) = delete;
  CudaDistributedMoE& operator=(const CudaDistributedMoE&) = delete;

  // This rank's tokens on the device: d_x [T, H] (F32, BF16 or F16), d_topk_ids / d_topk_weights
  // [T, K] (global ids) → d_out [T, H] fp32, the complete layer output of these tokens. Collective
  // over both groups. Synchronises `stream` once per call (the dispatch sizes travel through the
  // host: NCCL's send / receive sizes are host arguments); not capturable when ep > 1.
  void forward_device(const void* d_x, DType x_dtype, int T, const int32_t* d_topk_ids, const float* d_topk_weights,
                      float* d_out, void* stream);
  // Host convenience: routes x [T, H] fp32 with the router logits (or the router weight) on the host,
  // uploads, runs, downloads into out [T, H]; the routing into ws.
  void forward_host(const float* x, const float* router_logits, int T, MoEWorkspace& ws, float* out);

  const MoELayer& layer() const;
  int64_t last_bytes_sent() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmoe::cuda
