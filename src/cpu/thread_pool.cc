#include "cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "qmoe/error.h"

namespace qmoe::cpu {

namespace {
constexpr int kMaxLoops = 32;  // for_each calls per region
}  // namespace

struct TeamShared {
  Team::Loop loops[kMaxLoops];
  std::atomic<bool> failed{false};
  std::mutex error_m;
  std::exception_ptr error;
};

Team::Loop& Team::loop() {
  if (loop_index_ >= kMaxLoops) throw Error(fmt::format("thread pool: more than {} loops in one region", kMaxLoops));
  return s_->loops[loop_index_++];
}

bool Team::failed() const { return s_->failed.load(std::memory_order_relaxed); }

void Team::record(std::exception_ptr e) {
  std::lock_guard<std::mutex> lk(s_->error_m);
  if (!s_->error) s_->error = e;
  s_->failed.store(true, std::memory_order_relaxed);
}

void Team::wait_done(Loop& lp, int64_t n) {
  // Only members that took an index of this loop can still be working on it.
  for (int spin = 0; lp.done.load(std::memory_order_acquire) < n; ++spin) {
    if (spin < 200) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      const int64_t d = lp.done.load(std::memory_order_acquire);
      if (d < n) lp.done.wait(d, std::memory_order_acquire);
    }
  }
}

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(state_m_);
    stop_ = true;
    job_gen_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// Bounded by the hardware threads: a larger request would only oversubscribe (or fail to start).
// The count is read once: std::thread::hardware_concurrency() reads sysfs on every call (~5 µs on
// a VM, twice per layer call at decode).
int ThreadPool::resolve_threads(int threads) {
  static const int hw = [] {
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
  }();
  return threads > 0 ? std::min(threads, hw) : hw;
}

void ThreadPool::ensure_workers(int n) {
  (void)spin_micros();  // a malformed QMOE_CPU_SPIN_US throws here, on the caller, before any worker reads it
  std::lock_guard<std::mutex> lk(state_m_);
  while (static_cast<int>(workers_.size()) < n) {
    const int index = static_cast<int>(workers_.size());
    const uint64_t gen = job_gen_.load(std::memory_order_relaxed);  // regions announced from now on are this worker's
    workers_.emplace_back([this, index, gen] { worker_loop(index, gen); });
  }
}

int ThreadPool::spin_micros() {
  static const int us = [] {
    const char* v = std::getenv("QMOE_CPU_SPIN_US");
    if (v == nullptr || *v == '\0') return 100;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1000000)
      throw Error(fmt::format("QMOE_CPU_SPIN_US = '{}': expected microseconds in [0, 1000000]", v));
    return static_cast<int>(x);
  }();
  return us;
}

void ThreadPool::prewake(int threads) {
  if (resolve_threads(threads) <= 1 || spin_micros() == 0) return;
  bool any = false;
  {
    std::lock_guard<std::mutex> lk(state_m_);
    ++prewake_gen_;
    any = sleepers_ > 0;
  }
  if (any) wake_cv_.notify_all();
}

namespace {
// Spins until `gen` moves past `seen` or `us` microseconds pass (the caller checks which, under
// the pool's lock).
void spin_for(const std::atomic<uint64_t>& gen, uint64_t seen, int us) {
  if (us <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 64; ++i) {
      if (gen.load(std::memory_order_acquire) != seen) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
}
}  // namespace

void ThreadPool::worker_loop(int index, uint64_t seen) {
  uint64_t seen_prewake = 0;
  {
    std::lock_guard<std::mutex> lk(state_m_);
    seen_prewake = prewake_gen_;
  }
  for (;;) {
    const Body* body;
    TeamShared* shared;
    // Idle: spin a while for the next region (back-to-back regions, or one announced by
    // prewake), then sleep until a region or a prewake arrives.
    spin_for(job_gen_, seen, spin_micros());
    {
      std::unique_lock<std::mutex> lk(state_m_);
      if (job_gen_.load(std::memory_order_relaxed) == seen && prewake_gen_ == seen_prewake) {
        ++sleepers_;
        wake_cv_.wait(lk, [&] { return job_gen_.load(std::memory_order_relaxed) != seen || prewake_gen_ != seen_prewake; });
        --sleepers_;
      }
      seen_prewake = prewake_gen_;
      if (job_gen_.load(std::memory_order_relaxed) == seen) continue;  // a prewake: spin for the region
      seen = job_gen_.load(std::memory_order_relaxed);
      if (stop_) return;
      // Join only a region that is still open and has room for this worker.
      if (body_ == nullptr || index + 1 >= job_size_) continue;
      body = body_;
      shared = shared_;
      ++entered_;
    }
    Team team(shared, index + 1);
    try {
      (*body)(team);
    } catch (...) {
      team.record(std::current_exception());
    }
    // Loops end with their work done, but the counters' waiters may sleep on `done`.
    {
      std::lock_guard<std::mutex> lk(state_m_);
      ++exited_;
    }
    done_cv_.notify_all();
  }
}

void ThreadPool::run_body(int threads, const Body& body) {
  const int n = resolve_threads(threads);
  auto run_alone = [&] {
    TeamShared shared;
    Team team(&shared, 0);
    body(team);
    if (shared.error) std::rethrow_exception(shared.error);
  };
  if (n == 1) return run_alone();
  std::unique_lock<std::mutex> owner(busy_, std::try_to_lock);
  if (!owner.owns_lock()) return run_alone();  // another caller's region is running

  ensure_workers(n - 1);
  TeamShared shared;
  bool any_sleeping = false;
  {
    std::lock_guard<std::mutex> lk(state_m_);
    body_ = &body;
    shared_ = &shared;
    job_size_ = n;
    entered_ = exited_ = 0;
    job_gen_.fetch_add(1, std::memory_order_release);
    any_sleeping = sleepers_ > 0;
  }
  if (any_sleeping) wake_cv_.notify_all();  // spinning workers see job_gen_ by themselves
  {
    Team team(&shared, 0);
    try {
      body(team);
    } catch (...) {
      team.record(std::current_exception());
    }
  }
  {
    // Close the region (late workers will not join), then wait for the ones that joined.
    std::unique_lock<std::mutex> lk(state_m_);
    body_ = nullptr;
    shared_ = nullptr;
    done_cv_.wait(lk, [&] { return exited_ == entered_; });
  }
  if (shared.error) std::rethrow_exception(shared.error);
}

}  // namespace qmoe::cpu
