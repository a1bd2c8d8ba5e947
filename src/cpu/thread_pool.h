// A persistent thread pool for the optimized CPU kernels. One call runs an SPMD region: the same
// body on up to n threads (the caller is member 0), which share work through dynamic loops
// (Team::for_each). Workers are created on first use and reused by every later call.
//
// Built for shared, oversubscribed machines: nobody waits for a worker that has not started.
// A worker that wakes late joins the region at the loop in progress (earlier loops are already
// complete); one that wakes after the region finished does nothing; a loop ends when all of its
// indices are done, whoever did them. So a region is never slower than its caller alone.
// A region started while another caller's region is running runs on its caller alone, so
// concurrent callers never wait on each other (and never share mutable state).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace qmoe::cpu {

struct TeamShared;

// One member's view of a running region.
class Team {
 public:
  Team(TeamShared* shared, int id) : s_(shared), id_(id) {}
  int id() const { return id_; }
  // Dynamic loop over [0, n): members take the next index from a shared counter, in increasing
  // order, and call f(i); returns when every index is done (by any member), so writes made by
  // f are visible to everyone after it. Every member runs the same sequence of for_each calls.
  // Exceptions are recorded (the first one is rethrown by ThreadPool::run) and the remaining
  // indices skipped.
  template <class F>
  void for_each(int64_t n, F&& f) {
    Loop& lp = loop();
    for (;;) {
      const int64_t i = lp.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) break;
      if (!failed()) {
        try {
          f(i);
        } catch (...) {
          record(std::current_exception());
        }
      }
      if (lp.done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) lp.done.notify_all();
    }
    wait_done(lp, n);
  }
  // Like for_each, but member 0 runs every index and the others only wait for the loop to end:
  // for work too small to be worth waking (or waiting for) another thread.
  template <class F>
  void for_each_on_caller(int64_t n, F&& f) {
    Loop& lp = loop();
    if (id_ == 0) {
      for (int64_t i = 0; i < n; ++i) {
        if (failed()) break;
        try {
          f(i);
        } catch (...) {
          record(std::current_exception());
        }
      }
      lp.done.store(n, std::memory_order_release);
      lp.done.notify_all();
    }
    wait_done(lp, n);
  }
  // Records an exception thrown outside for_each (first one wins).
  void record(std::exception_ptr e);

  struct Loop {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };

 private:
  Loop& loop();
  void wait_done(Loop& lp, int64_t n);
  bool failed() const;
  TeamShared* s_;
  int id_;
  int loop_index_ = 0;
};

class ThreadPool {
 public:
  static ThreadPool& instance();
  ~ThreadPool();
  // Runs body(Team&) on up to `threads` members (≤ 0, or more than the hardware has: the hardware
  // thread count, std::thread::hardware_concurrency()). Rethrows the first exception any member
  // recorded or threw. The body is called through a reference to it (no copy, no allocation: a
  // layer call allocates nothing once warmed up).
  template <class F>
  void run(int threads, F&& body) {
    using B = std::remove_reference_t<F>;
    const Body b{const_cast<void*>(static_cast<const void*>(&body)),
                 [](void* o, Team& t) { (*static_cast<B*>(o))(t); }};
    run_body(threads, b);
  }
  static int resolve_threads(int threads);
  // Wakes the sleeping workers ahead of a region this caller is about to run on `threads` members
  // (the wake-up of a sleeping thread costs the caller a ~10 µs system call on a VM and the worker
  // tens of µs more to get going: started first, both overlap the caller's preparation). A woken
  // worker spins for kSpinMicros waiting for the region, then sleeps again. No-op with one thread
  // or QMOE_CPU_SPIN_US=0.
  void prewake(int threads);
  // How long an idle worker spins (checking for a new region) before it sleeps: after each region
  // and after a prewake. QMOE_CPU_SPIN_US overrides (0: never spin).
  static int spin_micros();

 private:
  // A non-owning reference to a region's body.
  struct Body {
    void* obj;
    void (*call)(void*, Team&);
    void operator()(Team& t) const { call(obj, t); }
  };
  ThreadPool() = default;
  void run_body(int threads, const Body& body);
  void ensure_workers(int n);
  void worker_loop(int index, uint64_t seen);

  std::mutex busy_;     // held by the caller owning the workers for a region
  std::mutex state_m_;  // guards the fields below
  std::condition_variable wake_cv_, done_cv_;
  std::vector<std::thread> workers_;
  // Bumped (under state_m_) for every region and at shutdown; read without the lock by spinning
  // workers.
  std::atomic<uint64_t> job_gen_{0};
  uint64_t prewake_gen_ = 0;  // bumped by prewake()
  int sleepers_ = 0;          // workers blocked on wake_cv_ (a region start notifies only if > 0)
  int job_size_ = 0;
  int entered_ = 0, exited_ = 0;  // workers that joined / left the current region
  bool stop_ = false;
  const Body* body_ = nullptr;  // null: no region open
  TeamShared* shared_ = nullptr;
};

}  // namespace qmoe::cpu
