// The one `error_of` of the test binaries: the qmoe::Error message that `fn` throws, or "" when it
// throws nothing (other exceptions propagate).
#pragma once

#include <functional>
#include <string>

#include "qmoe/error.h"

namespace qmoe::test {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace qmoe::test
