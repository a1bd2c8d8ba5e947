// read_moe_input: the hidden states (and router logits) of `qmoe run`, checked before any work.
#include "qmoe/moe_input.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "qmoe/error.h"
#include "util/files.h"

namespace qmoe {

MoEInput read_moe_input(const SafetensorsFile& in) {
  MoEInput r;
  const TensorInfo* info = in.find("hidden_states");
  if (info == nullptr)
    throw Error(fmt::format("input {}: tensor 'hidden_states' not found (expected hidden_states [T, H] BF16 or F32)",
                            in.path()));
  if (info->dtype != DType::BF16 && info->dtype != DType::F32)
    throw Error(fmt::format("input {}: 'hidden_states' has dtype {}; expected BF16 or F32", in.path(),
                            dtype_name(info->dtype)));
  if (info->shape.size() != 2)
    throw Error(
        fmt::format("input {}: 'hidden_states' has shape {}; expected [T, H]", in.path(), shape_str(info->shape)));
  r.tokens = info->shape[0];
  r.hidden = info->shape[1];
  if (r.tokens < 1 || r.hidden < 1)
    throw Error(fmt::format("input {}: 'hidden_states' has no tokens or no hidden size (shape {}); expected [T, H] "
                            "with T >= 1 and H >= 1",
                            in.path(), shape_str(info->shape)));
  if (r.tokens > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("input {}: 'hidden_states' has {} tokens; at most {} per run", in.path(), r.tokens,
                            std::numeric_limits<int32_t>::max()));
  util::check_allocation(static_cast<uint64_t>(r.tokens) * static_cast<uint64_t>(r.hidden) * 4 * 3,
                         fmt::format("input {}: 'hidden_states' {} as fp32 (input, output and workspace)", in.path(),
                                     shape_str(info->shape)));
  r.hidden_states = to_f32(in.get("hidden_states"), "hidden_states");
  check_finite_rows(r.hidden_states.data(), r.tokens, r.hidden, "hidden_states", fmt::format("input {}", in.path()));

  if (const TensorInfo* li = in.find("router_logits")) {
    if (li->dtype != DType::F32 || li->shape.size() != 2 || li->shape[0] != r.tokens || li->shape[1] < 1)
      throw Error(fmt::format("input {}: 'router_logits' is {} {}; expected F32 [{}, E] (one row per token)",
                              in.path(), dtype_name(li->dtype), shape_str(li->shape), r.tokens));
    r.logit_cols = li->shape[1];
    r.router_logits = to_f32(in.get("router_logits"), "router_logits");
    check_finite_rows(r.router_logits->data(), r.tokens, r.logit_cols, "router_logits",
                      fmt::format("input {}", in.path()));
  }
  return r;
}

}  // namespace qmoe
