// MoELayer: loading one layer from a checkpoint, construction checks, and run() (experts +
// shared expert). The layer holds no mutable state, so run() is thread-safe for separate workspaces.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "cpu/experts_optimized.h"
#include "cpu/ref/ref_ops.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

namespace {

// An owned copy, so that the layer keeps no view into the checkpoint's mapping (which is then
// unmapped once the layer is built).
Tensor optional_tensor(const Checkpoint& ckpt, const std::string& name) {
  return !name.empty() && ckpt.has(name) ? ckpt.get(name).clone() : Tensor{};
}

void check_finite_tensor(const Tensor& t, const std::string& name, const std::string& where) {
  if (!t.defined()) return;
  const std::vector<float> v = to_f32(t, name);
  const int64_t cols = t.ndim() >= 2 ? t.dim(-1) : t.numel();
  check_finite_rows(v.data(), cols ? t.numel() / cols : 0, cols, name, where, "row");
}

void check_numel(const Tensor& t, int64_t n, const char* what, const std::string& where) {
  if (t.defined() && t.numel() != n)
    throw Error(fmt::format("{}: {} has shape {}; expected {} values", where, what, shape_str(t.shape()), n));
}

}  // namespace

MoELayer MoELayer::from_checkpoint(const std::string& dir, int layer, const MoELayerOptions& opt) {
  ModelConfig cfg = ModelConfig::load(dir);
  if (layer < 0 || (cfg.num_layers > 0 && layer >= cfg.num_layers))
    throw Error(fmt::format("layer {} is out of range: {} has num_hidden_layers = {}", layer, dir, cfg.num_layers));
  if (!cfg.moe_layers.empty() && std::find(cfg.moe_layers.begin(), cfg.moe_layers.end(), layer) == cfg.moe_layers.end())
    throw Error(
        fmt::format("layer {} of {} has no MoE block (MoE layers: {})", layer, dir, fmt::join(cfg.moe_layers, ", ")));
  const Checkpoint ckpt = Checkpoint::open(dir);
  cfg.adapt_naming_to_checkpoint([&](const std::string& n) { return ckpt.has(n); });
  const LayerScheme scheme = resolve_moe_scheme(cfg, layer);
  ExpertParams experts = load_expert_params(ckpt, cfg, scheme, layer, opt.load);
  if (opt.before_process) opt.before_process(experts);
  std::optional<ExpertParams> shared;
  if (cfg.shared_expert_intermediate_size > 0) {
    const LayerScheme sscheme = resolve_shared_expert_scheme(cfg, layer);
    shared = load_shared_expert_params(ckpt, cfg, sscheme, layer, opt.load);
  }
  Tensor router_weight = optional_tensor(ckpt, cfg.router_weight_name(layer));
  Tensor router_bias = optional_tensor(ckpt, cfg.router_bias_name(layer));
  if (cfg.router_bias && !router_bias.defined())
    throw Error(fmt::format("tensor '{}' not found in checkpoint {} (config.json declares a router bias)",
                            cfg.router_bias_name(layer), dir));
  Tensor correction_bias;
  if (cfg.routing.has_correction_bias) correction_bias = ckpt.get(cfg.correction_bias_name(layer)).clone();
  Tensor shared_gate;
  if (cfg.shared_expert_gate && cfg.shared_expert_intermediate_size > 0)
    shared_gate = ckpt.get(cfg.shared_expert_gate_name(layer)).clone();
  return MoELayer(std::move(cfg), std::move(experts), std::move(shared), std::move(router_weight),
                  std::move(router_bias), std::move(correction_bias), std::move(shared_gate), opt);
}

MoELayer::MoELayer(ModelConfig cfg, ExpertParams experts, std::optional<ExpertParams> shared, Tensor router_weight,
                   Tensor router_bias, Tensor correction_bias, Tensor shared_gate, MoELayerOptions opt)
    : cfg_(std::move(cfg)),
      experts_(std::move(experts)),
      shared_(std::move(shared)),
      router_weight_(std::move(router_weight)),
      router_bias_(std::move(router_bias)),
      correction_bias_(std::move(correction_bias)),
      shared_gate_(std::move(shared_gate)),
      opt_(std::move(opt)) {
  const std::string where = cfg_.dir.empty() ? std::string("MoELayer") : fmt::format("MoELayer({})", cfg_.dir);
  if (!experts_.processed) process_expert_params(experts_);
  if (shared_ && !shared_->processed) process_expert_params(*shared_);
  ref::validate_expert_params(experts_, "MoELayer experts");
  const int E = experts_.num_experts, H = experts_.hidden;
  if (cfg_.num_experts == 0) cfg_.num_experts = E;  // a config built in memory may leave the sizes to the experts
  if (cfg_.hidden_size == 0) cfg_.hidden_size = H;
  if (cfg_.num_experts != E)
    throw Error(
        fmt::format("{}: experts have E = {} but the config says num_experts = {}", where, E, cfg_.num_experts));
  if (cfg_.hidden_size != H)
    throw Error(
        fmt::format("{}: experts have hidden = {} but the config says hidden_size = {}", where, H, cfg_.hidden_size));
  if (cfg_.top_k < 1 || cfg_.top_k > E)
    throw Error(fmt::format("{}: top_k = {} must be in [1, num_experts = {}]", where, cfg_.top_k, E));
  if (cfg_.routing.apply_router_weight_on_input && cfg_.top_k != 1)
    throw Error(fmt::format("{}: apply_router_weight_on_input needs top_k == 1, got {}", where, cfg_.top_k));
  if (router_weight_.defined() &&
      (router_weight_.ndim() != 2 || router_weight_.dim(0) != E || router_weight_.dim(1) != H))
    throw Error(fmt::format("{}: router weight has shape {}; expected [{}, {}]", where,
                            shape_str(router_weight_.shape()), E, H));
  check_numel(router_bias_, E, "router bias", where);
  if (cfg_.routing.has_correction_bias && !correction_bias_.defined())
    throw Error(fmt::format("{}: the routing uses e_score_correction_bias but the layer has none", where));
  check_numel(correction_bias_, E, "e_score_correction_bias", where);
  if (correction_bias_.defined()) correction_bias_f32_ = to_f32(correction_bias_, "e_score_correction_bias");
  if (router_weight_.defined()) router_weight_f32_ = to_f32(router_weight_, "router weight");
  if (router_bias_.defined()) router_bias_f32_ = to_f32(router_bias_, "router bias");
  if (shared_) {
    ref::validate_expert_params(*shared_, "MoELayer shared expert");
    if (shared_->num_experts != 1 || shared_->num_local != 1 || shared_->hidden != H)
      throw Error(fmt::format("{}: shared expert must have one local expert of hidden {}, has E = {}, hidden = {}",
                              where, H, shared_->num_experts, shared_->hidden));
  }
  check_numel(shared_gate_, H, "shared_expert_gate weight", where);
  if (shared_gate_.defined()) shared_gate_f32_ = to_f32(shared_gate_, "shared_expert_gate weight");
  // Routing inputs from the checkpoint must be finite: a NaN there would surface as "bad router
  // logits" of the first token.
  check_finite_tensor(router_weight_, "router weight", where);
  check_finite_tensor(router_bias_, "router bias", where);
  check_finite_tensor(correction_bias_, "e_score_correction_bias", where);
  check_finite_tensor(shared_gate_, "shared_expert_gate weight", where);
}

void MoELayer::run(const float* x, MoEWorkspace& ws, float* out) const {
  const int T = ws.T, K = ws.K, H = experts_.hidden;
  if (T < 1 || K != cfg_.top_k || ws.topk_ids.size() != static_cast<size_t>(T) * K ||
      ws.topk_weights.size() != ws.topk_ids.size())
    throw Error("run: the workspace holds no routing for this layer; call plan() first");
  if (x == nullptr || out == nullptr) throw Error("run: x and out must not be null");
  // The checked entry point: non-finite hidden states are refused (docs/DECISIONS.md).
  check_finite_rows(x, T, H, "hidden_states", "run");
  std::fill(out, out + static_cast<size_t>(T) * H, 0.0f);
  run_routed(x, T, ws.topk_ids.data(), ws.topk_weights.data(), out);
  // With expert parallelism the shared expert is added on EP rank 0 only, so the sum over ranks
  // counts it once.
  if (opt_.load.ep_rank == 0) run_shared(x, T, out);
}

void MoELayer::dispatch(const ExpertsArgs& a) const {
  if (opt_.runner)
    opt_.runner(a);
  else if (opt_.kernel == Kernel::Reference)
    experts_reference(a);
  else {
    cpu::OptimizedOptions o;
    o.bf16_activations = opt_.bf16_activations;
    cpu::experts_optimized_with(a, opt_.threads, o);
  }
}

void MoELayer::run_routed(const float* x, int T, const int32_t* topk_ids, const float* topk_weights,
                          float* out) const {
  if (T < 1) return;
  ExpertsArgs a;
  a.params = &experts_;
  a.x = x;
  a.T = T;
  a.K = cfg_.top_k;
  a.topk_ids = topk_ids;
  a.topk_weights = topk_weights;
  a.router_weight_on_input = cfg_.routing.apply_router_weight_on_input;
  a.out = out;
  dispatch(a);
}

// The shared expert: every token, weight 1 (or sigmoid(x·g) with a Qwen2-MoE gate).
void MoELayer::run_shared(const float* x, int T, float* out) const {
  if (!shared_ || T < 1) return;
  const int H = experts_.hidden;
  thread_local std::vector<int32_t> ids;  // grown only: no allocation per call once warmed up
  thread_local std::vector<float> w;
  ids.assign(static_cast<size_t>(T), 0);
  w.assign(static_cast<size_t>(T), 1.0f);
  if (shared_gate_.defined()) {
    const std::vector<float>& g = shared_gate_f32_;
    for (int t = 0; t < T; ++t) {
      double acc = 0.0;
      for (int h = 0; h < H; ++h)
        acc += static_cast<double>(x[static_cast<size_t>(t) * H + h] * g[static_cast<size_t>(h)]);
      const float v = static_cast<float>(acc);
      w[static_cast<size_t>(t)] = 1.0f / (1.0f + std::exp(-v));
    }
  }
  ExpertsArgs sa;
  sa.params = &*shared_;
  sa.x = x;
  sa.T = T;
  sa.K = 1;
  sa.topk_ids = ids.data();
  sa.topk_weights = w.data();
  sa.router_weight_on_input = false;
  sa.out = out;
  dispatch(sa);
}

}  // namespace qmoe
