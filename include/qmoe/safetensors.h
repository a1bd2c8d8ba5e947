// safetensors reading (mmap, whole header validated before any view is handed out), sharded
// checkpoints through model.safetensors.index.json, and writing (checkpoint-format.md §5–6).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/tensor.h"

namespace qmoe {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data buffer
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // mmap `path` and validate: 8-byte length within the file and ≤ 100 MB, valid JSON object,
  // known dtype strings, shape × dtype size == byte range, ranges inside the buffer, no overlaps.
  // Any violation throws qmoe::Error naming the file (and tensor) and what was expected. Only
  // regular files are accepted. Limitation: a file truncated by someone else while mapped makes a
  // later access to the lost pages raise SIGBUS; qmoe copies what it needs while loading and then
  // drops the mapping, so the window is the load itself.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // Read `path` into memory with read(2) (no mapping: a file that shrinks meanwhile cannot fault
  // later) and validate it like open(). For inputs (hidden states, calibration data).
  static std::shared_ptr<SafetensorsFile> read(const std::string& path);
  // Same validation on bytes in memory (`keepalive` owns them). `name` is used in messages.
  static std::shared_ptr<SafetensorsFile> from_bytes(std::shared_ptr<const void> keepalive,
                                                     const uint8_t* data, size_t size, std::string name);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // Zero-copy view (keeps the mapping alive). Throws qmoe::Error when absent.
  Tensor get(std::string_view name) const;
  // Done with tensor `name`: a mapped file drops its pages from memory (they are read back from
  // the file if a view touches them again). No effect on files read into memory.
  void release(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  bool mapped_ = false;
  std::string path_;
  std::shared_ptr<const void> keepalive_;
  const uint8_t* data_ = nullptr;  // start of the data buffer
  size_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: `model.safetensors.index.json` (weight_map) when
// present, else `model.safetensors`, else every `*.safetensors` file in the directory. Any of
// these names that exists but is not a regular file (a directory, FIFO, device...) is an error.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(std::string_view name) const;
  const TensorInfo* info(std::string_view name) const;  // nullptr when absent
  // Throws qmoe::Error "tensor 'NAME' not found in checkpoint DIR" when absent.
  Tensor get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  // Which file holds `name` (for messages).
  std::string file_of(std::string_view name) const;
  // Drop the mapped pages of every tensor whose name starts with `prefix` (see
  // SafetensorsFile::release): called once a tensor has been copied into the parameters.
  void release_prefix(std::string_view prefix) const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name → index in files_
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Write a safetensors file the way the Rust writer does: tensors sorted by dtype (descending
// enum order) then name, compact JSON header with __metadata__ first, header padded with spaces
// to a multiple of 8. Written to a unique temporary in PATH's directory (O_EXCL, never following
// a link), fsynced and renamed over PATH, so a failure leaves no partial file.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Write `model.safetensors.index.json` for shards (weight_map name → file, metadata.total_size).
void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size, uint64_t total_parameters);

}  // namespace qmoe
