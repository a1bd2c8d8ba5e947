// SafetensorsFile: mmap a file (or take bytes in memory), validate the whole header, then hand
// out zero-copy views that keep the mapping alive.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "io/safetensors_header.h"
#include "qmoe/error.h"
#include "qmoe/safetensors.h"
#include "util/files.h"

namespace qmoe {

namespace {

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO must not block the open; it is rejected below like every non-regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open safetensors file {}: {}", path, std::strerror(errno)));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(fmt::format("cannot stat safetensors file {}: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("safetensors file {} is {}; expected a regular file", path,
                            util::describe_non_regular(path).empty() ? std::string("not a regular file")
                                                                     : util::describe_non_regular(path)));
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return from_bytes(nullptr, nullptr, 0, path);  // mmap of 0 bytes fails; report "too short"

  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) throw Error(fmt::format("cannot mmap safetensors file {} ({} bytes): {}", path, size,
                                                  std::strerror(errno)));
  std::shared_ptr<const void> mapping(addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  auto f = from_bytes(std::move(mapping), static_cast<const uint8_t*>(addr), size, path);
  f->mapped_ = true;
  return f;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  auto bytes = std::make_shared<std::string>(
      util::read_regular_file(path, "safetensors file", std::numeric_limits<uint64_t>::max()));
  const auto* data = reinterpret_cast<const uint8_t*>(bytes->data());
  const size_t size = bytes->size();
  return from_bytes(std::shared_ptr<const void>(bytes, bytes->data()), data, size, path);
}

void SafetensorsFile::release(std::string_view name) const {
  if (!mapped_) return;
  const TensorInfo* info = find(name);
  if (info == nullptr || info->end == info->begin) return;
  // Drop the pages of this tensor from the process (a read-only private file mapping: they are
  // read back from the file if touched again). Rounded outwards to whole pages.
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_ + info->begin) & ~(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(data_ + info->end);
  (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_bytes(std::shared_ptr<const void> keepalive,
                                                             const uint8_t* data, size_t size, std::string name) {
  if (size < 8)
    throw Error(fmt::format("safetensors file {} is truncated / too short: {} bytes, expected at least 8 (the "
                            "header length)",
                            name, size));
  const uint64_t header_len = read_le64(data);
  if (header_len > io::kMaxHeaderBytes)
    throw Error(fmt::format("safetensors file {}: header length {} exceeds the limit of {} bytes (corrupt or not a "
                            "safetensors file)",
                            name, header_len, io::kMaxHeaderBytes));
  if (header_len > size - 8)
    throw Error(fmt::format("safetensors file {} is truncated / too short: header length {} needs {} bytes but the "
                            "file size is {} bytes",
                            name, header_len, 8 + header_len, size));

  io::HeaderContext ctx{name, size, header_len, size - 8 - header_len};
  io::ParsedHeader parsed = io::parse_safetensors_header(
      std::string_view(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(header_len)), ctx);

  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(name);
  f->keepalive_ = std::move(keepalive);
  f->data_ = data + 8 + header_len;
  f->data_size_ = static_cast<size_t>(ctx.data_size);
  f->tensors_ = std::move(parsed.tensors);
  f->metadata_ = std::move(parsed.metadata);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info) throw Error(fmt::format("tensor '{}' not found in {}", name, path_));
  return Tensor::view(info->dtype, info->shape, data_ + info->begin, keepalive_);
}

}  // namespace qmoe
