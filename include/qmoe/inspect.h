// The inspection report of a checkpoint (`qmoe inspect --json`, `qmoe.Checkpoint.inspect`): the
// architecture, and per MoE layer the resolved scheme (and how it matched), the sizes and the
// parameter table of the loaded + processed experts (and shared expert), totals, exclusions and
// warnings.
#pragma once

#include <string>
#include <vector>

namespace qmoe {

// The report as JSON text (an object: model_dir, architecture, quantization, layers, excluded,
// warnings), indented by `indent` spaces (< 0: one line). `layers` empty: every MoE layer.
// Each layer is loaded and processed in turn, so only one layer's parameters are in memory.
// Errors (unreadable checkpoint, unsupported scheme, ...): qmoe::Error as MoELayer::from_checkpoint.
std::string inspect_report_json(const std::string& dir, const std::vector<int>& layers = {}, int indent = 2);

}  // namespace qmoe
