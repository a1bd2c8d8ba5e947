// Checks of command-line options shared by the commands; all run before any work.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <thread>

#include "qmoe/error.h"

namespace qmoe::cli {

// --threads: 0 = all hardware threads; negative is an error; more than the hardware has is
// bounded to it, with a note on stderr.
inline int bounded_threads(int requested, const char* option = "--threads") {
  if (requested < 0)
    throw Error(fmt::format("{} must be >= 0 (0 = all hardware threads), got {}", option, requested));
  const unsigned hc = std::thread::hardware_concurrency();
  const int hw = hc == 0 ? 1 : static_cast<int>(hc);
  if (requested > hw) {
    std::fprintf(stderr, "qmoe: note: %s %d exceeds the %d hardware threads of this machine; using %d\n", option,
                 requested, hw, hw);
    return hw;
  }
  return requested;
}

// A decoder layer index given with `option`.
inline void check_layer_index(int layer, const char* option = "--layer") {
  if (layer < 0) throw Error(fmt::format("{} {}: a decoder layer index must be >= 0", option, layer));
}

}  // namespace qmoe::cli
