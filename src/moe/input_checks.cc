// check_experts_inputs: the finiteness rule of docs/DECISIONS.md ("Non-finite inputs") for the
// expert entry points (experts_reference, experts_optimized, experts_cuda).
#include <fmt/format.h>

#include "qmoe/error.h"
#include "qmoe/moe.h"

namespace qmoe {

void check_experts_inputs(const ExpertsArgs& a, const char* who) {
  if (a.params == nullptr || a.T <= 0 || a.x == nullptr) return;  // the callers report these
  check_finite_rows(a.x, a.T, a.params->hidden, "hidden_states", who);
  if (a.topk_weights != nullptr && a.K > 0) check_finite_rows(a.topk_weights, a.T, a.K, "topk_weights", who);
}

}  // namespace qmoe
