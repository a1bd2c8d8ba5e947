// SafetensorsFile: mmap a file (or take bytes in memory), validate the whole header, then hand
// out zero-copy views that keep the mapping alive.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "io/safetensors_header.h"
#include "qmoe/error.h"
#include "qmoe/safetensors.h"

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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open safetensors file {}: {}", path, std::strerror(errno)));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(fmt::format("cannot stat safetensors file {}: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("safetensors path {} is not a regular file", path));
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return from_bytes(nullptr, nullptr, 0, path);  // mmap of 0 bytes fails; report "too short"

  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) throw Error(fmt::format("cannot mmap safetensors file {} ({} bytes): {}", path, size,
                                                  std::strerror(errno)));
  std::shared_ptr<const void> mapping(addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return from_bytes(std::move(mapping), static_cast<const uint8_t*>(addr), size, path);
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
