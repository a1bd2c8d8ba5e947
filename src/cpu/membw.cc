#include "cpu/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <memory>
#include <new>
#include <vector>

#include "cpu/thread_pool.h"
#include "util/memory.h"

namespace qmoe::cpu {

namespace {

// Sum of n 64-bit words with 8 independent chains (the compiler vectorizes it).
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t s[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + static_cast<size_t>(j)];
  for (; i < n; ++i) s[0] += p[i];
  uint64_t t = 0;
  for (uint64_t v : s) t += v;
  return t;
}

std::atomic<uint64_t> g_sink{0};

}  // namespace

BandwidthResult measure_read_bandwidth(int threads, size_t bytes, int runs) {
  const int n = ThreadPool::resolve_threads(threads);
  bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
  // Allocated as tensor storage is (huge pages where the system allows them), so that the probe
  // reads memory the way the kernels read the weights.
  const std::shared_ptr<void> buf = util::alloc_uninit(bytes);
  uint64_t* words = static_cast<uint64_t*>(buf.get());
  const size_t nwords = bytes / 8;
  // Slices of 4 MB taken dynamically by the pool's threads (first touch too, with non-zero data).
  const size_t slice = size_t{1} << 19;  // words
  const int64_t nslices = static_cast<int64_t>((nwords + slice - 1) / slice);
  ThreadPool::instance().run(n, [&](Team& team) {
    team.for_each(nslices, [&](int64_t s) {
      const size_t from = static_cast<size_t>(s) * slice, to = std::min(nwords, from + slice);
      for (size_t i = from; i < to; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
    });
  });
  std::vector<double> gbps;
  for (int r = 0; r < std::max(1, runs) + 1; ++r) {  // first run: warm-up
    const auto t0 = std::chrono::steady_clock::now();
    ThreadPool::instance().run(n, [&](Team& team) {
      uint64_t acc = 0;
      team.for_each(nslices, [&](int64_t s) {
        const size_t from = static_cast<size_t>(s) * slice, to = std::min(nwords, from + slice);
        acc += sum_words(words + from, to - from);
      });
      g_sink.fetch_add(acc, std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  BandwidthResult res;
  res.median_gbps = gbps[gbps.size() / 2];
  res.max_gbps = gbps.back();
  res.bytes = bytes;
  res.runs = static_cast<int>(gbps.size());
  return res;
}

void flush_caches(size_t bytes) {
  static std::vector<uint64_t> buf;
  if (buf.size() * 8 < bytes) buf.assign(bytes / 8, 1);
  g_sink.fetch_add(sum_words(buf.data(), buf.size()), std::memory_order_relaxed);
}

namespace {

bool read_line(const std::string& path, std::string& out) {
  std::ifstream f(path);
  if (!f) return false;
  std::getline(f, out);
  return true;
}

// "32768K" / "1M" / "512" → bytes (0 when malformed).
int64_t parse_size(const std::string& s) {
  size_t pos = 0;
  int64_t v = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') v = v * 10 + (s[pos++] - '0');
  if (pos == 0) return 0;
  if (pos < s.size() && (s[pos] == 'K' || s[pos] == 'k')) v <<= 10;
  else if (pos < s.size() && (s[pos] == 'M' || s[pos] == 'm')) v <<= 20;
  else if (pos < s.size() && (s[pos] == 'G' || s[pos] == 'g')) v <<= 30;
  return v;
}

}  // namespace

CacheInfo last_level_cache() {
  CacheInfo best;
  std::set<std::string> seen;  // (level, shared_cpu_list) instances already counted
  int64_t total = 0;
  for (int cpu = 0; cpu < 4096; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/";
    std::string probe;
    if (!read_line(base + "index0/level", probe)) {
      if (cpu == 0) return best;  // no sysfs cache information
      break;
    }
    for (int idx = 0; idx < 16; ++idx) {
      const std::string d = base + "index" + std::to_string(idx) + "/";
      std::string level_s, type, size_s, shared;
      if (!read_line(d + "level", level_s)) break;
      read_line(d + "type", type);
      if (type == "Instruction" || !read_line(d + "size", size_s)) continue;
      read_line(d + "shared_cpu_list", shared);
      const int level = std::atoi(level_s.c_str());
      const int64_t size = parse_size(size_s);
      if (size <= 0 || level < best.level) continue;
      if (level > best.level) {  // a higher level: restart the count
        best.level = level;
        best.instances = 0;
        total = 0;
        seen.clear();
      }
      if (seen.insert(shared).second) {
        total += size;
        ++best.instances;
      }
    }
  }
  if (total > 0) {
    best.llc_bytes = total;
    best.from_sysfs = true;
  }
  return best;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(' ', c + 1));
    }
  return "unknown CPU";
}

}  // namespace qmoe::cpu
