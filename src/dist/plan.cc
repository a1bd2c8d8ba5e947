// Rank layout and the EP dispatch plan (qmoe/dist.h): pure host arithmetic, shared by the CPU and
// device paths.
#include <fmt/format.h>

#include <algorithm>

#include "qmoe/dist.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "qmoe/tensor.h"

namespace qmoe::dist {

std::vector<int> RankLayout::ep_group(int w) const {
  std::vector<int> g;
  for (int e = 0; e < ep; ++e) g.push_back(e * tp + tp_rank(w));
  return g;
}

std::vector<int> RankLayout::tp_group(int w) const {
  std::vector<int> g;
  for (int t = 0; t < tp; ++t) g.push_back(ep_rank(w) * tp + t);
  return g;
}

void validate_layout(const DistOptions& o, int num_experts) {
  if (o.ep < 1) throw Error(fmt::format("--ep must be at least 1, got {}", o.ep));
  if (o.tp < 1) throw Error(fmt::format("--tp must be at least 1, got {}", o.tp));
  if (o.ep > num_experts)
    throw Error(fmt::format("--ep {} is larger than the layer's {} experts: some EP rank would own no expert", o.ep,
                            num_experts));
}

void DispatchPlan::exchange_counts(Communicator& ep_comm, void* stream) {
  if (ep_comm.size() != ranks)
    throw Error(fmt::format("DispatchPlan::exchange_counts: the plan is for {} ranks, the group has {}", ranks,
                            ep_comm.size()));
  std::vector<int64_t> send_count(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) send_count[static_cast<size_t>(r)] = send_offset[r + 1] - send_offset[r];
  recv_count.assign(static_cast<size_t>(ranks), 0);
  ep_comm.exchange_counts(send_count.data(), recv_count.data(), stream);
  recv_offset.assign(static_cast<size_t>(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) recv_offset[r + 1] = recv_offset[r] + recv_count[static_cast<size_t>(r)];
}

void DispatchPlan::byte_spans(const std::vector<int64_t>& row_offset, size_t row_bytes, std::vector<size_t>& off,
                              std::vector<size_t>& bytes) {
  const size_t R = row_offset.size() - 1;
  off.resize(R);
  bytes.resize(R);
  for (size_t r = 0; r < R; ++r) {
    off[r] = static_cast<size_t>(row_offset[r]) * row_bytes;
    bytes[r] = static_cast<size_t>(row_offset[r + 1] - row_offset[r]) * row_bytes;
  }
}

std::vector<int> expert_owners(int num_experts, int ep) {
  std::vector<int> owner(static_cast<size_t>(num_experts), -1);
  for (int r = 0; r < ep; ++r) {
    const std::vector<int> map = ep_expert_map(num_experts, r, ep);
    for (int e = 0; e < num_experts; ++e)
      if (map[static_cast<size_t>(e)] >= 0) owner[static_cast<size_t>(e)] = r;
  }
  return owner;
}

DispatchPlan plan_dispatch(const int32_t* topk_ids, int T, int K, const std::vector<int>& owner, int ranks,
                           ExpertDispatch mode) {
  if (ranks < 1) throw Error(fmt::format("plan_dispatch: {} ranks", ranks));
  DispatchPlan p;
  p.ranks = ranks;
  const auto R = static_cast<size_t>(ranks);
  p.back_row.assign(static_cast<size_t>(T) * R, -1);
  // wants[t·R + r]: token t goes to rank r.
  std::vector<char> wants(static_cast<size_t>(T) * R, mode == ExpertDispatch::AllGather ? 1 : 0);
  if (mode == ExpertDispatch::AllToAll) {
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int32_t id = topk_ids[static_cast<size_t>(t) * K + k];
        if (id < 0 || static_cast<size_t>(id) >= owner.size())
          throw Error(fmt::format("plan_dispatch: token {} slot {} has expert id {}, outside [0, {})", t, k, id,
                                  owner.size()));
        wants[static_cast<size_t>(t) * R + static_cast<size_t>(owner[static_cast<size_t>(id)])] = 1;
      }
  }
  p.send_offset.assign(R + 1, 0);
  for (size_t r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t)
      if (wants[static_cast<size_t>(t) * R + r]) {
        p.back_row[static_cast<size_t>(t) * R + r] = static_cast<int32_t>(p.send_tokens.size());
        p.send_tokens.push_back(t);
      }
    p.send_offset[r + 1] = static_cast<int64_t>(p.send_tokens.size());
  }
  p.recv_count.assign(R, 0);
  p.recv_offset.assign(R + 1, 0);
  return p;
}

}  // namespace qmoe::dist

namespace qmoe::dist {

void gather_static_scales(ExpertParams& p, Communicator& ep_comm) {
  if (ep_comm.size() == 1) return;
  // Every rank must take part, also one whose scheme has no static scales (then all ranks have none).
  const bool has = p.w13_input_scale.defined() && p.w2_input_scale.defined();
  auto gather = [&](Tensor& t, const char* which) {
    const int64_t n = has ? t.numel() : 0;
    std::vector<int64_t> counts(static_cast<size_t>(ep_comm.size()));
    ep_comm.all_gather_host(&n, sizeof(n), counts.data());
    int64_t cap = 0, total = 0;
    for (int64_t c : counts) cap = std::max(cap, c), total += c;
    if (cap == 0) return;
    if (n == 0)
      throw Error(fmt::format("gather_static_scales: EP rank {} has no {} static activation scale but another rank "
                              "has; every rank must load the same scheme",
                              ep_comm.rank(), which));
    std::vector<float> mine(static_cast<size_t>(cap), 0.0f), all(static_cast<size_t>(cap * ep_comm.size()));
    const std::vector<float> v = to_f32(t, which);
    std::copy(v.begin(), v.end(), mine.begin());
    ep_comm.all_gather_host(mine.data(), mine.size() * sizeof(float), all.data());
    std::vector<float> joined;
    joined.reserve(static_cast<size_t>(total));
    for (int r = 0; r < ep_comm.size(); ++r)
      joined.insert(joined.end(), all.begin() + static_cast<ptrdiff_t>(r * cap),
                    all.begin() + static_cast<ptrdiff_t>(r * cap + counts[static_cast<size_t>(r)]));
    t = Tensor::from_f32(joined, {total});
  };
  gather(p.w13_input_scale, "w13");
  gather(p.w2_input_scale, "w2");
}

}  // namespace qmoe::dist
