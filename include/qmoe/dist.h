// Expert and tensor parallelism: one MoE layer spread over the ranks of a group (GPUs of a node
// over NCCL, or threads of one process on the CPU).
//
// Layout. A group of ep × tp ranks; world rank w = e·tp + t is EP rank e and TP rank t. The ranks of
// one TP group (same e) hold the same tokens and slice every expert's intermediate dimension (spec
// §7.2); the EP ranks (same t) own disjoint contiguous ranges of the experts (LoadOptions' split)
// and each holds its own tokens. A layer is called on every rank at once (one thread per rank, or
// one process per rank), each with its own tokens, and returns on every rank the complete output of
// its own tokens.
//
// Expert parallelism (ExpertDispatch::AllToAll, the default): each token's hidden state travels
// once to every EP rank that owns at least one of its top-k experts (with its ids and weights), the
// rank runs its local experts on what it received with the ordinary kernels, the weighted partial
// rows travel back, and the home rank sums them in rank order (deterministic, bit-identical reruns).
// ExpertDispatch::AllGather is the baseline: every token goes to every rank and every partial row
// comes back (the traffic of an all-gather + reduce-scatter). The shared expert (if any) runs on
// every EP rank for that rank's own tokens. Tensor parallelism: each rank computes its slice's
// partial output, then one all-reduce over the TP group (w2 bias is added once: the loader zeroes it
// on TP ranks ≠ 0).
//
// Static activation scales (fp8 / int8 static, MX a_fp8, NVFP4 input_scale_2) are reduced over the
// experts of every EP rank, not only this rank's, so every layout computes what one rank computes.
// TP keeps the seed's per-slice semantics: a per-token dynamic scale of the GEMM2 input is taken over
// this rank's slice of the intermediate (the conformance cases' tp2 partials).
//
// The hidden states travel in their own dtype (fp32 here; bf16 / fp16 on the device path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/moe.h"

namespace qmoe::dist {

// A group of ranks that exchange buffers. Host buffers (the in-process group) or device buffers
// (NCCL; `stream` is a cudaStream_t, calls are stream-ordered). Every rank of the group must make
// the same calls in the same order. Errors: qmoe::Error naming the operation and the rank.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool device_memory() const = 0;  // buffers are device pointers
  virtual std::string name() const = 0;    // "nccl", "in-process"

  // buf [n] fp32, summed over the ranks in place; every rank gets the same bits.
  virtual void all_reduce_sum(float* buf, size_t n, void* stream) = 0;
  // Rank r's bytes send + send_off[p] .. + send_bytes[p] go to rank p, where they land at
  // recv + recv_off[r]; recv_bytes[p] is what p sends here. Offsets and sizes are host arrays of
  // size() entries.
  virtual void all_to_all_v(const void* send, const size_t* send_off, const size_t* send_bytes, void* recv,
                            const size_t* recv_off, const size_t* recv_bytes, void* stream) = 0;
  // Host integers: send[p] goes to rank p, recv[p] is what p sent here. Blocks until done.
  virtual void exchange_counts(const int64_t* send, int64_t* recv, void* stream) = 0;
  // Host bytes: every rank passes `bytes` bytes; recv [size() × bytes] holds them by rank. Blocks.
  virtual void all_gather_host(const void* send, size_t bytes, void* recv) = 0;
  // A rank that cannot go on (a load error, say) calls this so that the others, blocked in a
  // collective, raise an error instead of waiting for ever. The group is unusable afterwards.
  virtual void abort(const std::string& why) = 0;
};

// `n` communicators of one in-process group over host memory, one per rank, to be driven by n
// threads (each call blocks until every rank has made it). For the CPU backend and for tests.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n);

enum class ExpertDispatch { AllToAll, AllGather };

struct DistOptions {
  int ep = 1, tp = 1;
  ExpertDispatch dispatch = ExpertDispatch::AllToAll;
};

// World rank ↔ (ep rank, tp rank); the member lists of the EP and TP groups of a world rank.
struct RankLayout {
  int ep = 1, tp = 1;
  int world() const { return ep * tp; }
  int ep_rank(int w) const { return w / tp; }
  int tp_rank(int w) const { return w % tp; }
  std::vector<int> ep_group(int w) const;  // world ranks with the same tp rank, by ep rank
  std::vector<int> tp_group(int w) const;  // world ranks with the same ep rank, by tp rank
};
// Checks ep, tp ≥ 1, ep ≤ E, I divisible as the loader needs: qmoe::Error naming the option.
void validate_layout(const DistOptions& o, int num_experts);

// The send plan of one EP rank: which of its tokens go to which EP rank, and where each partial row
// comes back. Pure host arithmetic shared by the CPU and device paths.
struct DispatchPlan {
  int ranks = 1;
  std::vector<int32_t> send_tokens;   // token ids, grouped by destination rank, token order within
  std::vector<int64_t> send_offset;   // [ranks + 1] prefix sums into send_tokens (rows)
  std::vector<int64_t> recv_count;    // [ranks] rows each rank sends here (after exchange_counts)
  std::vector<int64_t> recv_offset;   // [ranks + 1]
  // [T, ranks]: row of token t in the returned partials (= its send position) for rank p, −1 when t
  // was not sent to p.
  std::vector<int32_t> back_row;
  int64_t rows_out() const { return send_offset.back(); }
  int64_t rows_in() const { return recv_offset.back(); }
  // Fills recv_count / recv_offset from the other ranks' plans (collective over `ep_comm`).
  void exchange_counts(Communicator& ep_comm, void* stream);
  // Byte offset and size per rank of rows of `row_bytes` bytes, from row prefix sums [ranks + 1].
  static void byte_spans(const std::vector<int64_t>& row_offset, size_t row_bytes, std::vector<size_t>& off,
                         std::vector<size_t>& bytes);
};
// owner[e] = EP rank owning global expert e. AllGather: every token to every rank.
DispatchPlan plan_dispatch(const int32_t* topk_ids, int T, int K, const std::vector<int>& owner, int ranks,
                           ExpertDispatch mode);
// The EP owner of every global expert under LoadOptions' contiguous split.
std::vector<int> expert_owners(int num_experts, int ep);
// Replaces the (unprocessed) static activation scales of `p` by those of every rank of `ep_comm`
// (rank order), so that processing reduces over all experts. No static scales: nothing. Collective.
void gather_static_scales(ExpertParams& p, Communicator& ep_comm);

// Layer `layer` of `dir` loaded for this rank: EP rank ep_comm.rank() of o.ep, TP rank tp_comm.rank()
// of o.tp, static activation scales gathered over the EP group. A load error aborts both groups.
MoELayer load_rank_layer(const std::string& dir, int layer, Communicator& ep_comm, Communicator& tp_comm,
                         const DistOptions& o, MoELayerOptions base = {});

// The routing of one rank's tokens, as every distributed forward starts: T ≥ 0, x (and out) non-null
// and finite when T > 0, layer.plan on the logits (or plan_from_hidden without them) into ws; T = 0
// leaves ws empty (the rank still serves the others). `who` names the caller in errors.
void route_rank_tokens(const MoELayer& layer, const float* x, const float* router_logits, int T, const float* out,
                       MoEWorkspace& ws, const char* who);

// One rank's share of an MoE layer on the CPU (host buffers, in-process communicators).
class DistributedMoE {
 public:
  // Loads layer `layer` of `dir` for world rank w = ep_comm.rank()·tp + tp_comm.rank(); ep_comm and
  // tp_comm are this rank's EP and TP groups (sizes o.ep and o.tp).
  DistributedMoE(const std::string& dir, int layer, Communicator& ep_comm, Communicator& tp_comm,
                 const DistOptions& o, const MoELayerOptions& base = {});
  // This rank's tokens: x [T, H] fp32, router logits [T, E] fp32 (null: from the router weight) →
  // out [T, H] (the complete layer output) and the routing in `ws`. T may be 0 on some ranks
  // (nothing to send; the rank still serves the others). Collective over both groups. An error on
  // one rank (bad input) aborts both groups, so the other ranks raise too instead of hanging.
  void forward(const float* x, const float* router_logits, int T, MoEWorkspace& ws, float* out);

  const MoELayer& layer() const { return layer_; }
  const DistOptions& options() const { return opt_; }
  // Bytes this rank sent in the last forward (dispatch + combine), for bandwidth figures.
  int64_t last_bytes_sent() const { return last_bytes_; }

 private:
  void forward_impl(const float* x, const float* router_logits, int T, MoEWorkspace& ws, float* out);
  MoELayer layer_;
  Communicator& ep_;
  Communicator& tp_;
  DistOptions opt_;
  std::vector<int> owner_;
  int64_t last_bytes_ = 0;
};

}  // namespace qmoe::dist
