// Shared helpers of the CPU conformance tests: where the cases are, which exist, and the
// scale-free error they are judged by (conformance/README.md).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace qmoe::conformance {

// QMOE_CONFORMANCE_DIR overrides the location (a copy carried to a GPU machine).
inline std::string cases_dir() {
  const char* env = std::getenv("QMOE_CONFORMANCE_DIR");
  return env && *env ? std::string(env) + "/" : std::string(QMOE_SOURCE_DIR "/../shared/conformance/cases/");
}

// Case directory names (sorted); error cases (case.json expect_error) only when asked for.
inline std::vector<std::string> list_cases(bool include_error_cases) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cases_dir(), ec)) {
    if (!entry.is_directory() || !fs::exists(entry.path() / "case.json")) continue;
    std::ifstream jf(entry.path() / "case.json");
    if (include_error_cases || !nlohmann::json::parse(jf).value("expect_error", false))
      names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// ‖got − want‖₂ / ‖want‖₂ (the absolute norm when want is zero).
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace qmoe::conformance
