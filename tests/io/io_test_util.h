// Helpers shared by the io tests: temp directories, raw safetensors byte builders.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "qmoe/error.h"
#include "qmoe/safetensors.h"

namespace qmoe::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed (with its contents) on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("qmoe_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
             std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void put_le64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// 8-byte length + `header` + `data_size` data bytes (value i & 0xff at position i).
inline std::vector<uint8_t> make_raw(const std::string& header, size_t data_size) {
  std::vector<uint8_t> out;
  put_le64(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

// Parse bytes from an exactly-sized heap copy (so ASan catches any read past the end).
inline std::shared_ptr<SafetensorsFile> parse_bytes(const std::vector<uint8_t>& bytes,
                                                    const std::string& name = "mem.safetensors") {
  std::shared_ptr<uint8_t[]> copy(new uint8_t[bytes.empty() ? 1 : bytes.size()]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  const uint8_t* p = copy.get();
  return SafetensorsFile::from_bytes(std::shared_ptr<const void>(copy, copy.get()), p, bytes.size(), name);
}

inline std::string conformance_dir() { return QMOE_SOURCE_DIR "/../shared/conformance/cases/"; }

}  // namespace qmoe::test
