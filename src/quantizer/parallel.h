// Small std::thread helpers of the quantizer (internal).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <system_error>
#include <vector>

namespace qmoe::quantizer_detail {

// Number of worker threads for a request (≤ 0: hardware concurrency), at least 1.
// More than the hardware threads are never started (a huge request is bounded, not an abort).
inline int resolve_threads(int requested) {
  const unsigned hc = std::thread::hardware_concurrency();
  const int hw = hc == 0 ? 1 : static_cast<int>(hc);
  return requested > 0 ? std::min(requested, hw) : hw;
}

// Calls fn(i) for i in [0, n) on up to `threads` threads (dynamic scheduling). The first
// exception thrown by any call is rethrown after every thread has stopped.
template <class Fn>
void parallel_for(int64_t n, int threads, Fn&& fn) {
  if (n <= 0) return;
  const int nt = static_cast<int>(std::min<int64_t>(resolve_threads(std::max(1, threads)), n));
  if (nt == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(nt - 1));
  try {
    for (int t = 1; t < nt; ++t) pool.emplace_back(worker);
  } catch (const std::system_error&) {
    // The system refused another thread: the ones started (and this one) do the work.
  }
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace qmoe::quantizer_detail
