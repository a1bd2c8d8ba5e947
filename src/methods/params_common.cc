// create_expert_params / load_expert_params / load_shared_expert_params: parameter creation per
// method (dispatch), EP expert maps, the TP slice of the intermediate dimension (spec §7.2, §7.5)
// and the per-expert, per-projection load loop (gate first, then up, then down).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>

#include "methods/params_internal.h"
#include "qmoe/error.h"
#include "util/files.h"

namespace qmoe::methods {

std::string expert_desc(const ExpertParams& p, int local) {
  const int g = local >= 0 && local < static_cast<int>(p.local_to_global.size()) ? p.local_to_global[local] : local;
  return fmt::format("expert {} of '{}'", g, p.prefix.empty() ? std::string("(unnamed experts)") : p.prefix);
}

namespace {

void create_for_method(ExpertParams& p) {
  switch (p.scheme->method) {
    case Method::OcpMx: create_ocp_mx(p); break;
    case Method::Nvfp4: create_nvfp4(p); break;
    case Method::W8A8Int8: create_w8a8_int8(p); break;
    case Method::W8A8Fp8: create_w8a8_fp8(p); break;
    case Method::Unquantized: create_unquantized(p); break;
  }
}

void load_for_method(ExpertParams& p, const ProjSource& src) {
  switch (p.scheme->method) {
    case Method::OcpMx: load_ocp_mx(p, src); break;
    case Method::Nvfp4: load_nvfp4(p, src); break;
    case Method::W8A8Int8: load_w8a8_int8(p, src); break;
    case Method::W8A8Fp8: load_w8a8_fp8(p, src); break;
    case Method::Unquantized: load_unquantized(p, src); break;
  }
}

// Validate a global → local map and return local → global.
std::vector<int> invert_expert_map(const std::vector<int>& map, int num_experts) {
  if (static_cast<int>(map.size()) != num_experts)
    throw Error(fmt::format("expert_map has {} entries, expected one per global expert ({})", map.size(),
                            num_experts));
  const int n_local = static_cast<int>(std::count_if(map.begin(), map.end(), [](int v) { return v >= 0; }));
  if (n_local == 0) throw Error("expert_map maps no expert to this rank (every entry is -1)");
  std::vector<int> l2g(static_cast<size_t>(n_local), -1);
  for (int g = 0; g < num_experts; ++g) {
    const int l = map[static_cast<size_t>(g)];
    if (l == -1) continue;
    if (l < -1 || l >= n_local)
      throw Error(fmt::format("expert_map[{}] = {} is invalid: expected -1 or a local id in [0, {})", g, l, n_local));
    if (l2g[static_cast<size_t>(l)] != -1)
      throw Error(fmt::format("expert_map assigns local id {} twice (global experts {} and {})", l,
                              l2g[static_cast<size_t>(l)], g));
    l2g[static_cast<size_t>(l)] = g;
  }
  return l2g;
}

void check_sizes(const SchemeInfo& s, int hidden, int inter) {
  if (hidden < 1 || inter < 1)
    throw Error(fmt::format("expert sizes must be positive: hidden H={}, intermediate I_p={}", hidden, inter));
  const int bs = weight_block_size(s.weight);
  if (bs == 0) return;
  const char* kind = s.weight == WeightFormat::Nvfp4 ? "NVFP4" : "MX";
  if (hidden % bs != 0)
    throw Error(fmt::format("scheme {}: hidden size H={} is not a multiple of the {} block size {} (the weight scales "
                            "of w13 have one entry per {} elements of H)",
                            s.name, hidden, kind, bs, bs));
  if (inter % bs != 0)
    throw Error(fmt::format("scheme {}: the per-rank intermediate size I_p={} is not a multiple of the {} block size "
                            "{} (w2 has one scale per {} elements of I_p; with tensor parallelism choose a tp_size "
                            "whose slices are multiples of {})",
                            s.name, inter, kind, bs, bs, bs));
}

void check_options(const LoadOptions& o) {
  if (o.tp_size < 1) throw Error(fmt::format("tp_size must be >= 1, got {}", o.tp_size));
  if (o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    throw Error(fmt::format("tp_rank {} is out of range for tp_size {} (expected 0 <= tp_rank < tp_size)", o.tp_rank,
                            o.tp_size));
  if (o.ep_size < 1) throw Error(fmt::format("ep_size must be >= 1, got {}", o.ep_size));
  if (o.ep_rank < 0 || o.ep_rank >= o.ep_size)
    throw Error(fmt::format("ep_rank {} is out of range for ep_size {} (expected 0 <= ep_rank < ep_size)", o.ep_rank,
                            o.ep_size));
}


// This rank's slice of I (§7.2; gpt-oss block formats §7.5).
InterSlice tp_slice(const SchemeInfo& s, int64_t inter, int tp_rank, int tp_size, bool gpt_oss,
                    std::string_view where) {
  if (inter < 1) throw Error(fmt::format("{}: intermediate size must be positive, got {}", where, inter));
  const int bs = weight_block_size(s.weight);
  if (gpt_oss && bs > 0) {
    if (inter % bs != 0)
      throw Error(fmt::format("{}: intermediate size I={} is not a multiple of the {} block size {}", where, inter,
                              s.name, bs));
    const int64_t blocks = inter / bs;
    const int64_t per_rank = (blocks + tp_size - 1) / tp_size * bs;
    const int64_t start = per_rank * tp_rank;
    const int64_t end = std::min(start + per_rank, inter);
    if (start >= inter)
      throw Error(fmt::format("{}: tp_rank {} of tp_size {} gets no part of the intermediate size I={} (slices of {} "
                              "= ceil(I/{}/tp)·{}); use a smaller tp_size",
                              where, tp_rank, tp_size, inter, per_rank, bs, bs));
    return {start, end - start};
  }
  if (inter % tp_size != 0)
    throw Error(fmt::format("{}: intermediate size I={} is not divisible by tp_size {}", where, inter, tp_size));
  const int64_t per_rank = inter / tp_size;
  return {per_rank * tp_rank, per_rank};
}

void check_layer(const ModelConfig& cfg, const LayerScheme& scheme, int layer) {
  if (scheme.scheme == nullptr)
    throw Error(fmt::format("layer {}: the layer scheme is unresolved (no SchemeInfo)", layer));
  if (layer < 0 || (cfg.num_layers > 0 && layer >= cfg.num_layers))
    throw Error(fmt::format("layer {} is out of range (the model has {} layers)", layer, cfg.num_layers));
  if (!cfg.moe_layers.empty() && std::find(cfg.moe_layers.begin(), cfg.moe_layers.end(), layer) == cfg.moe_layers.end())
    throw Error(fmt::format("layer {} has no MoE block (MoE layers: {})", layer, fmt::join(cfg.moe_layers, ", ")));
}

struct ShardName {
  Shard shard;
  std::string proj;
};

// Load every local expert: per expert gate, up (the last written input scale wins), down.
void load_all(ExpertParams& p, const Checkpoint& ckpt, const std::vector<ShardName>& shards, InterSlice slice,
              bool has_bias, const std::function<std::string(int global, const std::string& proj)>& base_of) {
  auto source = [&](int l, const ShardName& sn) {
    const int g = p.local_to_global[static_cast<size_t>(l)];
    ProjSource src;
    src.ckpt = &ckpt;
    src.base = base_of(g, sn.proj);
    src.shard = sn.shard;
    src.local = l;
    src.global = g;
    src.hidden = p.hidden;
    src.inter_full = p.inter_full;
    src.slice = slice;
    src.tp_rank = p.tp_rank;
    return src;
  };
  if (p.scheme->method == Method::Unquantized && p.num_local > 0 && !shards.empty())
    adopt_unquantized_dtype(p, source(0, shards.front()));
  for (int l = 0; l < p.num_local; ++l) {
    for (const ShardName& sn : shards) {
      const ProjSource src = source(l, sn);
      load_for_method(p, src);
      if (has_bias) load_bias(p, src);
      ckpt.release_prefix(src.base + ".");  // copied into the parameters: drop the mapped pages
    }
  }
}

// Before anything is allocated: every weight tensor this rank will load exists with the shape the
// config implies, so a config declaring sizes the checkpoint does not store fails with the tensor's
// name instead of allocating for them; then the allocation is checked against the machine.
void precheck_weights(const Checkpoint& ckpt, const SchemeInfo& s, const std::vector<int>& map,
                      const std::vector<ShardName>& shards, int64_t hidden, int64_t inter_full, int64_t inter_p,
                      const std::function<std::string(int global, const std::string& proj)>& base_of,
                      std::string_view where) {
  const WeightFormat f = s.weight;
  auto cols = [&](int64_t in) { return f == WeightFormat::BF16 ? in : packed_bytes(f, in); };
  int64_t n_local = 0;
  for (size_t g = 0; g < map.size(); ++g) {
    if (map[g] < 0) continue;
    ++n_local;
    for (const ShardName& sn : shards) {
      const std::string name = base_of(static_cast<int>(g), sn.proj) + ".weight";
      const TensorInfo* info = ckpt.info(name);
      if (info == nullptr)
        throw Error(fmt::format("tensor '{}' is missing from the checkpoint in '{}' (needed for {}: config.json "
                                "declares {} experts, hidden_size {}, intermediate size {})",
                                name, ckpt.dir(), where, map.size(), hidden, inter_full));
      const int64_t out = sn.shard == Shard::Down ? hidden : sn.shard == Shard::GateUp ? 2 * inter_full : inter_full;
      const int64_t in = sn.shard == Shard::Down ? inter_full : hidden;
      const Shape expected{out, cols(in)};
      if (info->shape != expected)
        throw Error(fmt::format("tensor '{}': shape {} does not match the expected shape {} ({} weight of {}: "
                                "config.json declares hidden_size {}, intermediate size {})",
                                name, shape_str(info->shape), shape_str(expected), to_string(f), where, hidden,
                                inter_full));
    }
  }
  // Parameter bytes: the weights (F32 for unquantized) plus at most a few percent of scales.
  const int64_t elem_num = f == WeightFormat::BF16 ? 4 : 1;
  const uint64_t w13 = static_cast<uint64_t>(2 * inter_p) * static_cast<uint64_t>(cols(hidden) * elem_num);
  const uint64_t w2 = static_cast<uint64_t>(hidden) * static_cast<uint64_t>(cols(inter_p) * elem_num);
  util::check_allocation(static_cast<uint64_t>(n_local) * (w13 + w2) / 16 * 17,
                         fmt::format("loading the {} local experts of {}", n_local, where));
}

}  // namespace
}  // namespace qmoe::methods

namespace qmoe {

using namespace methods;

ActivationSpec activation_spec_of(const ModelConfig& cfg, bool interleaved) {
  ActivationSpec a;
  a.kind = cfg.activation;
  a.interleaved = interleaved;
  a.alpha = cfg.swiglu_alpha;
  a.limit = cfg.swiglu_limit;
  return a;
}

ExpertParams create_expert_params(const SchemeInfo& scheme, int num_experts, const std::vector<int>& expert_map,
                                  int hidden, int inter_per_rank, bool has_bias, const ActivationSpec& act) {
  if (num_experts < 1) throw Error(fmt::format("number of experts must be >= 1, got {}", num_experts));
  check_sizes(scheme, hidden, inter_per_rank);
  ExpertParams p;
  p.scheme = &scheme;
  p.act = act;
  p.num_experts = num_experts;
  if (expert_map.empty()) {
    p.expert_map.resize(static_cast<size_t>(num_experts));
    for (int i = 0; i < num_experts; ++i) p.expert_map[static_cast<size_t>(i)] = i;
  } else {
    p.expert_map = expert_map;
  }
  p.local_to_global = invert_expert_map(p.expert_map, num_experts);
  p.num_local = static_cast<int>(p.local_to_global.size());
  p.hidden = hidden;
  p.inter = inter_per_rank;
  p.inter_full = inter_per_rank;
  create_for_method(p);
  if (has_bias) {
    p.w13_bias = Tensor::zeros(DType::F32, {p.num_local, 2 * static_cast<int64_t>(inter_per_rank)});
    p.w2_bias = Tensor::zeros(DType::F32, {p.num_local, hidden});
  }
  return p;
}

ExpertParams load_expert_params(const Checkpoint& ckpt, const ModelConfig& cfg, const LayerScheme& scheme, int layer,
                                const LoadOptions& opt) {
  check_layer(cfg, scheme, layer);
  check_options(opt);
  const int E = cfg.num_experts;
  if (E < 1) throw Error(fmt::format("layer {}: the model config declares {} experts", layer, E));
  const std::string prefix = cfg.experts_prefix(layer);
  const bool gpt_oss = cfg.naming == ExpertNaming::GptOss;
  const InterSlice slice = tp_slice(*scheme.scheme, cfg.moe_intermediate_size, opt.tp_rank, opt.tp_size, gpt_oss,
                                    fmt::format("experts of layer {} ('{}')", layer, prefix));
  const std::vector<int> map = opt.expert_map.empty() ? ep_expert_map(E, opt.ep_rank, opt.ep_size) : opt.expert_map;

  const std::vector<std::string> names = cfg.projection_names();
  std::vector<ShardName> shards;
  if (gpt_oss) {
    shards = {{Shard::GateUp, names.size() > 0 ? names[0] : "gate_up_proj"},
              {Shard::Down, names.size() > 2 ? names[2] : "down_proj"}};
  } else {
    if (names.size() != 3) throw Error(fmt::format("layer {}: expected 3 projection names, got {}", layer, names.size()));
    shards = {{Shard::Gate, names[0]}, {Shard::Up, names[1]}, {Shard::Down, names[2]}};
  }
  const auto base_of = [&](int g, const std::string& proj) { return fmt::format("{}.{}.{}", prefix, g, proj); };
  precheck_weights(ckpt, *scheme.scheme, map, shards, cfg.hidden_size, cfg.moe_intermediate_size, slice.len, base_of,
                   fmt::format("the experts of layer {} ('{}')", layer, prefix));

  ExpertParams p = create_expert_params(*scheme.scheme, E, map, cfg.hidden_size, static_cast<int>(slice.len),
                                        cfg.expert_bias, activation_spec_of(cfg, gpt_oss));
  p.inter_full = cfg.moe_intermediate_size;
  p.tp_rank = opt.tp_rank;
  p.tp_size = opt.tp_size;
  p.prefix = prefix;
  p.act_scale_mode = scheme.act_scale_mode;
  load_all(p, ckpt, shards, slice, cfg.expert_bias, base_of);
  return p;
}

ExpertParams load_shared_expert_params(const Checkpoint& ckpt, const ModelConfig& cfg, const LayerScheme& scheme,
                                       int layer, const LoadOptions& opt) {
  check_layer(cfg, scheme, layer);
  check_options(opt);
  const std::string prefix = cfg.shared_expert_prefix(layer);
  if (prefix.empty() || cfg.shared_expert_intermediate_size < 1)
    throw Error(fmt::format("layer {} has no shared expert (model_type {})", layer, cfg.model_type));
  const InterSlice slice = tp_slice(*scheme.scheme, cfg.shared_expert_intermediate_size, opt.tp_rank, opt.tp_size,
                                    false, fmt::format("shared expert of layer {} ('{}')", layer, prefix));
  const std::vector<ShardName> shards = {{Shard::Gate, "gate_proj"}, {Shard::Up, "up_proj"}, {Shard::Down, "down_proj"}};
  const auto base_of = [&](int, const std::string& proj) { return fmt::format("{}.{}", prefix, proj); };
  precheck_weights(ckpt, *scheme.scheme, {0}, shards, cfg.hidden_size, cfg.shared_expert_intermediate_size, slice.len,
                   base_of, fmt::format("the shared expert of layer {} ('{}')", layer, prefix));
  // The shared expert is replicated on every EP rank: E = 1, always local.
  ExpertParams p = create_expert_params(*scheme.scheme, 1, {0}, cfg.hidden_size, static_cast<int>(slice.len), false,
                                        activation_spec_of(cfg, false));
  p.inter_full = cfg.shared_expert_intermediate_size;
  p.tp_rank = opt.tp_rank;
  p.tp_size = opt.tp_size;
  p.prefix = prefix;
  p.act_scale_mode = scheme.act_scale_mode;
  load_all(p, ckpt, shards, slice, false, base_of);
  return p;
}

// vLLM's contiguous split: base = E / ep, the first E % ep ranks own one more.
std::vector<int> ep_expert_map(int num_experts, int ep_rank, int ep_size) {
  if (ep_size > num_experts)
    throw Error(fmt::format("ep_size {} is larger than the number of experts {}: some ranks would own no expert",
                            ep_size, num_experts));
  const int base = num_experts / ep_size, rem = num_experts % ep_size;
  const int count = base + (ep_rank < rem ? 1 : 0);
  const int start = ep_rank * base + std::min(ep_rank, rem);
  std::vector<int> map(static_cast<size_t>(num_experts), -1);
  for (int i = 0; i < count; ++i) map[static_cast<size_t>(start + i)] = i;
  return map;
}

}  // namespace qmoe
