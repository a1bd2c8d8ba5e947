#include "cpu/thread_pool.h"

#include <algorithm>

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
    ++job_gen_;
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
  std::lock_guard<std::mutex> lk(state_m_);
  while (static_cast<int>(workers_.size()) < n) {
    const int index = static_cast<int>(workers_.size());
    const uint64_t gen = job_gen_;  // regions announced from now on are this worker's
    workers_.emplace_back([this, index, gen] { worker_loop(index, gen); });
  }
}

void ThreadPool::worker_loop(int index, uint64_t seen) {
  for (;;) {
    const Body* body;
    TeamShared* shared;
    {
      std::unique_lock<std::mutex> lk(state_m_);
      wake_cv_.wait(lk, [&] { return job_gen_ != seen; });
      seen = job_gen_;
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
  {
    std::lock_guard<std::mutex> lk(state_m_);
    body_ = &body;
    shared_ = &shared;
    job_size_ = n;
    entered_ = exited_ = 0;
    ++job_gen_;
  }
  wake_cv_.notify_all();
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
