// Expert linear names per architecture (checkpoint-format.md §3.2).
#include "quantizer/names.h"

#include <fmt/format.h>

namespace qmoe::quantizer_detail {

std::vector<ExpertLinear> routed_expert_linears(const ModelConfig& cfg, int layer, int e) {
  const std::string base = fmt::format("{}.{}.", cfg.experts_prefix(layer), e);
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  const auto names = cfg.projection_names();
  if (cfg.naming == ExpertNaming::GptOss)
    return {{base + names[0], ProjRole::GateUp, layer, e, 2 * I, H}, {base + names[2], ProjRole::Down, layer, e, H, I}};
  return {{base + names[0], ProjRole::Gate, layer, e, I, H},
          {base + names[1], ProjRole::Up, layer, e, I, H},
          {base + names[2], ProjRole::Down, layer, e, H, I}};
}

std::vector<ExpertLinear> shared_expert_linears(const ModelConfig& cfg, int layer) {
  const std::string p = cfg.shared_expert_prefix(layer);
  if (p.empty()) return {};
  const int64_t H = cfg.hidden_size, I = cfg.shared_expert_intermediate_size;
  return {{p + ".gate_proj", ProjRole::Gate, layer, -1, I, H},
          {p + ".up_proj", ProjRole::Up, layer, -1, I, H},
          {p + ".down_proj", ProjRole::Down, layer, -1, H, I}};
}

}  // namespace qmoe::quantizer_detail
