// Internal: reading and writing files the way hostile inputs cannot abuse. Reads accept regular
// files only (never block on a FIFO or read a device) and bound their size; writes go through a
// unique temporary in the destination directory (O_EXCL, never following a link), are fsynced
// and renamed over the destination, so a reader sees the old file or the whole new one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qmoe::util {

// Largest JSON text file read (config.json, model.safetensors.index.json, case.json).
constexpr uint64_t kMaxJsonFileBytes = 256ull << 20;

// What kind of file system object `path` is, for messages: "a directory", "a FIFO", ... ("" when
// it is a regular file or does not exist). Does not follow a final symbolic link when `lstat`.
std::string describe_non_regular(const std::string& path);

// The whole content of the regular file `path` (read(2), no mapping). Throws qmoe::Error naming
// `what` and the path when it is missing, not a regular file, larger than `max_bytes`, or unreadable.
std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes);

// Physical memory of this machine in bytes (0 when unknown).
uint64_t physical_memory_bytes();
// Throws qmoe::Error "`what` needs N GB ... this machine has M GB" when `bytes` exceeds the
// physical memory, so a hopeless allocation fails with a message before any work.
void check_allocation(uint64_t bytes, std::string_view what);
// "1.50 GB" style size for messages.
std::string format_bytes(uint64_t bytes);

// Checks that `path` can be written as an output file before any work is done: not empty, not a
// directory, its parent directory exists and is writable. `option` names the flag ("-o").
void check_output_file(const std::string& path, std::string_view option);

// A file written through a unique temporary next to `path`; commit() fsyncs and renames it over
// `path` (replacing a link, never writing through it). Destroyed without commit(): the temporary
// is removed and `path` is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* data, size_t n);
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// write `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text);

// fsync the directory holding `path` (best effort), so a rename into it is durable.
void sync_parent_dir(const std::string& path);

// A unique new directory next to `path` ("<dir>/.<name>.<tag>-XXXXXX"), created with mkdtemp.
std::string make_sibling_temp_dir(const std::string& path, std::string_view tag);

}  // namespace qmoe::util
