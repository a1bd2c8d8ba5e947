#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "qmoe/error.h"

namespace qmoe::util {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISREG(m)) return "";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32));
  return fmt::format("{:016x}", rng());
}

}  // namespace

std::string describe_non_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected by the fstat below.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) throw Error(fmt::format("cannot open {} {}: {}", what, path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw Error(fmt::format("cannot stat {} {}: {}", what, path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("{} {} is {}; expected a regular file", what, path, kind_of(st.st_mode)));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    throw Error(fmt::format("{} {} is {} bytes; the limit is {} bytes", what, path, size, max_bytes));
  check_allocation(size, fmt::format("reading {} {}", what, path));
  std::string out;
  out.resize(static_cast<size_t>(size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(fmt::format("cannot read {} {}: {}", what, path, std::strerror(errno)));
    }
    if (n == 0) break;  // the file shrank while being read: use what is there
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.2f} KiB", b / (1ull << 10));
  return fmt::format("{} bytes", bytes);
}

void check_allocation(uint64_t bytes, std::string_view what) {
  const uint64_t mem = physical_memory_bytes();
  if (mem != 0 && bytes > mem)
    throw Error(fmt::format("{} needs {} of memory but this machine has {} ({} bytes needed)", what,
                            format_bytes(bytes), format_bytes(mem), bytes));
}

// An existing destination must be a regular file or a symbolic link (which the rename replaces):
// renaming over a device, FIFO or socket would replace that node (e.g. -o /dev/null as root).
static void check_replaceable(const std::string& path, std::string_view who) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return;
  throw Error(fmt::format("{} {}: is {}; expected a regular file or a new file name", who, path, kind_of(st.st_mode)));
}

void check_output_file(const std::string& path, std::string_view option) {
  if (path.empty()) throw Error(fmt::format("{}: the output path is empty; expected a file name", option));
  if (path.back() == '/')
    throw Error(fmt::format("{} {}: names a directory; expected a file name", option, path));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(fmt::format("{} {}: is a directory; expected a file name", option, path));
  check_replaceable(path, option);
  const std::string dir = parent_of(path);
  if (::stat(dir.c_str(), &st) != 0)
    throw Error(fmt::format("{} {}: the directory {} does not exist ({})", option, path, dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) throw Error(fmt::format("{} {}: {} is not a directory", option, path, dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(fmt::format("{} {}: cannot create files in {} ({})", option, path, dir, std::strerror(errno)));
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw Error("cannot write a file with an empty name");
  check_replaceable(path_, "cannot write");
  const std::string dir = parent_of(path_), base = base_of(path_);
  if (base.empty() || base == "." || base == "..")
    throw Error(fmt::format("cannot write {}: expected a file name, not a directory", path_));
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp_ = fmt::format("{}/.{}.tmp-{}-{}", dir, base, ::getpid(), random_suffix());
    // O_EXCL: a name that exists (a planted file or link) is never opened, let alone followed.
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  const int err = errno;
  tmp_.clear();
  throw Error(fmt::format("cannot create a temporary file in {} to write {}: {}", dir, path_, std::strerror(err)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw Error(fmt::format("cannot write {}: fsync: {}", path_, std::strerror(errno)));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw Error(fmt::format("cannot finish writing {}: {}", path_, std::strerror(errno)));
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(fmt::format("cannot write {}: it is a directory", path_));
  check_replaceable(path_, "cannot write");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error(fmt::format("cannot rename {} to {}: {}", tmp_, path_, std::strerror(errno)));
  committed_ = true;
  sync_parent_dir(path_);
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

void sync_parent_dir(const std::string& path) {
  Fd d{::open(parent_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) (void)::fsync(d.fd);
}

std::string make_sibling_temp_dir(const std::string& path, std::string_view tag) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string templ = fmt::format("{}/.{}.{}-XXXXXX", parent_of(p), base_of(p), tag);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    throw Error(fmt::format("cannot create a temporary directory next to {}: {}", p, std::strerror(errno)));
  return std::string(buf.data());
}

}  // namespace qmoe::util
