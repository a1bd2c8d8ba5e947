// DistributedMoE on the CPU (qmoe/dist.h): dispatch → local experts → combine, then the TP sum.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "qmoe/dist.h"
#include "qmoe/error.h"
#include "qmoe/tensor.h"

namespace qmoe::dist {

MoELayer load_rank_layer(const std::string& dir, int layer, Communicator& ep, Communicator& tp, const DistOptions& o,
                         MoELayerOptions opt) {
  opt.load.ep_rank = ep.rank();
  opt.load.ep_size = o.ep;
  opt.load.tp_rank = tp.rank();
  opt.load.tp_size = o.tp;
  opt.load.expert_map.clear();
  opt.before_process = [&ep](ExpertParams& p) { gather_static_scales(p, ep); };
  try {
    if (ep.size() != o.ep || tp.size() != o.tp)
      throw Error(fmt::format("distributed layer: the EP group has {} ranks and the TP group {}, but ep = {} and tp = "
                              "{} were asked for",
                              ep.size(), tp.size(), o.ep, o.tp));
    return MoELayer::from_checkpoint(dir, layer, opt);
  } catch (const std::exception& e) {
    // The other ranks may be waiting for this one in a collective: release them.
    ep.abort(e.what());
    tp.abort(e.what());
    throw;
  }
}


void route_rank_tokens(const MoELayer& layer, const float* x, const float* router_logits, int T, const float* out,
                       MoEWorkspace& ws, const char* who) {
  if (T < 0) throw Error(fmt::format("{}: token count T = {} is negative", who, T));
  if (T == 0) {
    ws.T = 0;
    ws.K = layer.config().top_k;
    ws.topk_ids.clear();
    ws.topk_weights.clear();
    return;
  }
  if (x == nullptr || out == nullptr) throw Error(fmt::format("{}: x and out must not be null", who));
  check_finite_rows(x, T, layer.experts().hidden, "hidden_states", who);
  if (router_logits)
    layer.plan(router_logits, T, ws);
  else
    layer.plan_from_hidden(x, T, ws);
}

DistributedMoE::DistributedMoE(const std::string& dir, int layer, Communicator& ep_comm, Communicator& tp_comm,
                               const DistOptions& o, const MoELayerOptions& base)
    : layer_((ep_comm.device_memory() || tp_comm.device_memory())
                 ? throw Error(fmt::format("DistributedMoE runs on host memory; the {} communicator holds device "
                                           "buffers (use qmoe::cuda::CudaDistributedMoE)",
                                           ep_comm.device_memory() ? ep_comm.name() : tp_comm.name()))
                 : load_rank_layer(dir, layer, ep_comm, tp_comm, o, base)),
      ep_(ep_comm),
      tp_(tp_comm),
      opt_(o) {
  validate_layout(o, layer_.config().num_experts);
  owner_ = expert_owners(layer_.config().num_experts, o.ep);
}

void DistributedMoE::forward(const float* x, const float* router_logits, int T, MoEWorkspace& ws, float* out) {
  try {
    forward_impl(x, router_logits, T, ws, out);
  } catch (const std::exception& e) {
    // Bad input on one rank must not leave the others waiting in a collective.
    ep_.abort(e.what());
    tp_.abort(e.what());
    throw;
  }
}

void DistributedMoE::forward_impl(const float* x, const float* router_logits, int T, MoEWorkspace& ws, float* out) {
  route_rank_tokens(layer_, x, router_logits, T, out, ws, "DistributedMoE::forward");
  const int H = layer_.experts().hidden, K = layer_.config().top_k;
  const auto sH = static_cast<size_t>(H), sK = static_cast<size_t>(K);
  if (T > 0) std::fill(out, out + static_cast<size_t>(T) * sH, 0.0f);
  last_bytes_ = 0;

  if (opt_.ep == 1) {
    layer_.run_routed(x, T, ws.topk_ids.data(), ws.topk_weights.data(), out);
  } else {
    DispatchPlan p = plan_dispatch(ws.topk_ids.data(), T, K, owner_, opt_.ep, opt_.dispatch);
    const int R = opt_.ep;
    p.exchange_counts(ep_, nullptr);
    const auto S = static_cast<size_t>(p.rows_out()), N = static_cast<size_t>(p.rows_in());

    // Pack this rank's rows (hidden state, ids, weights) by destination.
    std::vector<float> xs(S * sH), ws_s(S * sK), xr(N * sH), wr(N * sK);
    std::vector<int32_t> is(S * sK), ir(N * sK);
    for (size_t i = 0; i < S; ++i) {
      const auto t = static_cast<size_t>(p.send_tokens[i]);
      std::memcpy(&xs[i * sH], x + t * sH, sH * sizeof(float));
      std::memcpy(&is[i * sK], &ws.topk_ids[t * sK], sK * sizeof(int32_t));
      std::memcpy(&ws_s[i * sK], &ws.topk_weights[t * sK], sK * sizeof(float));
    }
    std::vector<size_t> so, sb, ro, rb;
    auto exchange = [&](const void* send, void* recv, size_t row_bytes, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) {
      DispatchPlan::byte_spans(send_rows, row_bytes, so, sb);
      DispatchPlan::byte_spans(recv_rows, row_bytes, ro, rb);
      ep_.all_to_all_v(send, so.data(), sb.data(), recv, ro.data(), rb.data(), nullptr);
      for (int r = 0; r < R; ++r)
        if (r != ep_.rank()) last_bytes_ += static_cast<int64_t>(sb[static_cast<size_t>(r)]);
    };
    exchange(xs.data(), xr.data(), sH * sizeof(float), p.send_offset, p.recv_offset);
    exchange(is.data(), ir.data(), sK * sizeof(int32_t), p.send_offset, p.recv_offset);
    exchange(ws_s.data(), wr.data(), sK * sizeof(float), p.send_offset, p.recv_offset);

    // This rank's experts on everything it received (ids of other ranks' experts are skipped).
    std::vector<float> part(N * sH, 0.0f), back(S * sH);
    layer_.run_routed(xr.data(), static_cast<int>(N), ir.data(), wr.data(), part.data());
    exchange(part.data(), back.data(), sH * sizeof(float), p.recv_offset, p.send_offset);

    // Combine in rank order: deterministic.
    for (int t = 0; t < T; ++t) {
      float* o = out + static_cast<size_t>(t) * sH;
      for (int r = 0; r < R; ++r) {
        const int32_t row = p.back_row[static_cast<size_t>(t) * static_cast<size_t>(R) + static_cast<size_t>(r)];
        if (row < 0) continue;
        const float* b = &back[static_cast<size_t>(row) * sH];
        for (size_t h = 0; h < sH; ++h) o[h] += b[h];
      }
    }
  }
  // The shared expert: on every EP rank, for its own tokens (TP-sliced, summed below).
  layer_.run_shared(x, T, out);
  if (opt_.tp > 1) {
    tp_.all_reduce_sum(out, static_cast<size_t>(T) * sH, nullptr);
    last_bytes_ += static_cast<int64_t>(static_cast<size_t>(T) * sH * sizeof(float));
  }
}

}  // namespace qmoe::dist
