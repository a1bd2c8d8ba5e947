// Helpers for the expert-parameter tests: conformance case discovery, exact (by value) comparison
// with first-mismatch reporting, temporary checkpoint directories.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "qmoe/safetensors.h"
#include "qmoe/tensor.h"

namespace qmoe::test {

inline std::filesystem::path cases_dir() { return std::filesystem::path(QMOE_SOURCE_DIR "/../shared/conformance/cases"); }

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(f);
}

// Every case directory (sorted) whose case.json has expect_error == `errors`.
inline std::vector<std::string> case_names(bool errors) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(cases_dir(), ec)) {
    if (!d.is_directory() || !std::filesystem::exists(d.path() / "case.json")) continue;
    const auto c = read_json(d.path() / "case.json");
    if (c.value("expect_error", false) == errors) out.push_back(d.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Exact comparison by value (−0 == +0, NaN == NaN); reports the first mismatch.
inline ::testing::AssertionResult same_values(const float* got, const float* want, size_t n, const std::string& what) {
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    const bool eq = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
    if (!eq) {
      if (first == n) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << n << " values differ; first at index "
                                       << first << ": got " << got[first] << ", expected " << want[first];
}
inline ::testing::AssertionResult same_values(const std::vector<float>& got, const std::vector<float>& want,
                                              const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != expected " << want.size();
  return same_values(got.data(), want.data(), got.size(), what);
}

// Does `msg` contain one of `keywords` (case-insensitive)?
inline bool contains_any_ci(std::string msg, const std::vector<std::string>& keywords) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  msg = lower(msg);
  for (const auto& k : keywords)
    if (msg.find(lower(k)) != std::string::npos) return true;
  return false;
}

// A fresh temporary directory, removed at destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("qmoe_methods_" + tag + "_" + std::to_string(rd()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace qmoe::test
