#include "cpu/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "cpu/thread_pool.h"

namespace qmoe::cpu {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

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
  std::unique_ptr<void, FreeDeleter> buf(std::aligned_alloc(4096, bytes));
  if (!buf) throw std::bad_alloc();
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

}  // namespace qmoe::cpu
