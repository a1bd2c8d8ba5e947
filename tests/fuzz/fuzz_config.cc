// libFuzzer target: config.json parsing (ModelConfig::parse, with the Quark quantization_config
// inside) and, for configs that parse, scheme resolution of the first MoE layers (exclude /
// layer_quant_config pattern matching). Only qmoe::Error may escape.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "qmoe/config.h"
#include "qmoe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const qmoe::ModelConfig cfg = qmoe::ModelConfig::parse(text, "fuzz/config.json");
    // Resolution loops over E × 3 expert linears: bound it so one input stays fast.
    if (cfg.num_experts > 512) return 0;
    const size_t n = std::min<size_t>(cfg.moe_layers.size(), 2);
    for (size_t i = 0; i < n; ++i) {
      try {
        (void)qmoe::resolve_moe_scheme(cfg, cfg.moe_layers[i]);
        if (!cfg.shared_expert_prefix(cfg.moe_layers[i]).empty())
          (void)qmoe::resolve_shared_expert_scheme(cfg, cfg.moe_layers[i]);
      } catch (const qmoe::Error&) {
      }
    }
  } catch (const qmoe::Error&) {
  }
  try {
    (void)qmoe::QuarkConfig::parse(text, "fuzz/quantization_config");
  } catch (const qmoe::Error&) {
  }
  return 0;
}
