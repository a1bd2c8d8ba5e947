// The in-process group (qmoe/dist.h): each collective is two phases around a barrier — every rank
// posts its buffers, then every rank copies what it needs from the others' posts, then a second
// barrier lets the posts go. A size mismatch is recorded by the rank that sees it and raised on
// every rank after the second barrier, so no thread is left waiting.
#include <fmt/format.h>

#include <cstdint>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "dist/in_process.h"
#include "qmoe/error.h"

namespace qmoe::dist {

namespace {

struct Post {
  const void* send = nullptr;
  const size_t* send_off = nullptr;
  const size_t* send_bytes = nullptr;
  const int64_t* counts = nullptr;
  const float* buf = nullptr;
  size_t n = 0;
  const void* bytes_ptr = nullptr;
};

// A reusable barrier that an aborting rank can break: every waiter then raises its reason.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!aborted_.empty()) throw Error(aborted_);
    const uint64_t gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen || !aborted_.empty(); });
    if (gen_ == gen) throw Error(aborted_);
  }
  void abort(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = std::move(why);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, waiting_ = 0;
  uint64_t gen_ = 0;
  std::string aborted_;
};

struct Shared {
  explicit Shared(int n, const MemoryOps& o) : size(n), ops(o), sync(n), posts(static_cast<size_t>(n)) {}
  int size;
  MemoryOps ops;
  Barrier sync;
  std::vector<Post> posts;
  std::mutex mu;
  std::string error;  // first mismatch seen in the current collective

  void fail(std::string msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = std::move(msg);
  }
  // The second barrier; then every rank raises the recorded error (the last one to leave clears it
  // before the next collective starts, which needs everyone at the first barrier again).
  void finish(int rank) {
    sync.arrive_and_wait();
    std::string e;
    {
      std::lock_guard<std::mutex> lock(mu);
      e = error;
    }
    sync.arrive_and_wait();
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      error.clear();
    }
    if (!e.empty()) throw Error(e);
  }
  void copy(void* dst, const void* src, size_t bytes) const {
    if (bytes == 0) return;
    if (ops.copy)
      ops.copy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  }
};

class InProcess final : public Communicator {
 public:
  InProcess(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  bool device_memory() const override { return s_->ops.device; }
  std::string name() const override { return "in-process"; }
  void abort(const std::string& why) override {
    s_->sync.abort(fmt::format("in-process group: rank {} gave up ({}); every rank stops", rank_, why));
  }

  void all_reduce_sum(float* buf, size_t n, void* stream) override {
    if (s_->ops.sync) s_->ops.sync(stream);
    s_->posts[static_cast<size_t>(rank_)] = Post{nullptr, nullptr, nullptr, nullptr, buf, n};
    s_->sync.arrive_and_wait();
    bool ok = true;
    for (int p = 0; p < s_->size; ++p)
      if (s_->posts[static_cast<size_t>(p)].n != n) {
        ok = false;
        s_->fail(fmt::format("all_reduce_sum: rank {} passed {} values, rank {} passed {}", rank_, n, p,
                             s_->posts[static_cast<size_t>(p)].n));
      }
    if (ok && n > 0) {
      // Rank order, the same on every rank: every rank computes identical bits.
      std::vector<float> acc(n, 0.0f), tmp(n);
      for (int p = 0; p < s_->size; ++p) {
        s_->copy(tmp.data(), s_->posts[static_cast<size_t>(p)].buf, n * sizeof(float));
        for (size_t i = 0; i < n; ++i) acc[i] = p == 0 ? tmp[i] : acc[i] + tmp[i];
      }
      results_ = std::move(acc);
    }
    // Nobody may overwrite its buffer before everyone has read it.
    s_->sync.arrive_and_wait();
    if (ok && n > 0) s_->copy(buf, results_.data(), n * sizeof(float));
    s_->finish(rank_);
  }

  void all_to_all_v(const void* send, const size_t* send_off, const size_t* send_bytes, void* recv,
                    const size_t* recv_off, const size_t* recv_bytes, void* stream) override {
    if (s_->ops.sync) s_->ops.sync(stream);
    s_->posts[static_cast<size_t>(rank_)] = Post{send, send_off, send_bytes, nullptr, nullptr, 0};
    s_->sync.arrive_and_wait();
    for (int p = 0; p < s_->size; ++p) {
      const Post& q = s_->posts[static_cast<size_t>(p)];
      const size_t bytes = q.send_bytes[rank_];
      if (bytes != recv_bytes[p]) {
        s_->fail(fmt::format("all_to_all_v: rank {} expects {} bytes from rank {}, which sends {}", rank_,
                             recv_bytes[p], p, bytes));
        continue;
      }
      s_->copy(static_cast<char*>(recv) + recv_off[p], static_cast<const char*>(q.send) + q.send_off[rank_], bytes);
    }
    s_->finish(rank_);
  }

  void exchange_counts(const int64_t* send, int64_t* recv, void* stream) override {
    (void)stream;
    s_->posts[static_cast<size_t>(rank_)] = Post{nullptr, nullptr, nullptr, send, nullptr, 0};
    s_->sync.arrive_and_wait();
    for (int p = 0; p < s_->size; ++p) recv[p] = s_->posts[static_cast<size_t>(p)].counts[rank_];
    s_->finish(rank_);
  }

  void all_gather_host(const void* send, size_t bytes, void* recv) override {
    Post post;
    post.bytes_ptr = send;
    post.n = bytes;
    s_->posts[static_cast<size_t>(rank_)] = post;
    s_->sync.arrive_and_wait();
    for (int p = 0; p < s_->size; ++p) {
      const Post& q = s_->posts[static_cast<size_t>(p)];
      if (q.n != bytes) {
        s_->fail(fmt::format("all_gather_host: rank {} passes {} bytes, rank {} passes {}", rank_, bytes, p, q.n));
        continue;
      }
      if (bytes) std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(p) * bytes, q.bytes_ptr, bytes);
    }
    s_->finish(rank_);
  }

 private:
  std::shared_ptr<Shared> s_;
  int rank_;
  std::vector<float> results_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n, const MemoryOps& ops) {
  if (n < 1) throw Error(fmt::format("make_in_process_group: group size must be at least 1, got {}", n));
  auto s = std::make_shared<Shared>(n, ops);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcess>(s, r));
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n) { return make_in_process_group(n, {}); }

}  // namespace qmoe::dist
