// qmoe error type: every failure the library reports is a qmoe::Error whose message says
// what is wrong, where (file / tensor / layer / field) and what was expected.
#pragma once

#include <stdexcept>
#include <string>

namespace qmoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace qmoe
