// libFuzzer target: the `qmoe run` input reader (safetensors validation + read_moe_input: dtypes,
// shapes, sizes, finiteness). Only qmoe::Error may escape; an accepted input is whole and finite.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "qmoe/error.h"
#include "qmoe/moe_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = qmoe::SafetensorsFile::from_bytes(nullptr, data, size, "fuzz-input");
    const qmoe::MoEInput in = qmoe::read_moe_input(*f);
    if (in.hidden_states.size() != static_cast<size_t>(in.tokens * in.hidden)) __builtin_trap();
    for (float v : in.hidden_states)
      if (!std::isfinite(v)) __builtin_trap();
    if (in.router_logits && in.router_logits->size() != static_cast<size_t>(in.tokens * in.logit_cols))
      __builtin_trap();
  } catch (const qmoe::Error&) {
  }
  return 0;
}
