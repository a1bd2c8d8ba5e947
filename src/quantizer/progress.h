// Progress reporting on stderr for long quantizer / demo jobs (internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace qmoe::quantizer_detail {

// A bar redrawn in place when stderr is a terminal, otherwise a line at every 25 %; or, with a
// callback, callback(label, done, total) at the start, on every advance and at the end instead.
// Thread-safe (callback calls are serialised); does nothing when disabled and without a callback.
class Progress {
 public:
  using Callback = std::function<void(const std::string& label, uint64_t done, uint64_t total)>;
  Progress(std::string label, uint64_t total, bool enabled, Callback callback = {});
  ~Progress();
  void add(uint64_t done);  // advance by `done` units
  void finish();            // print the final state (idempotent)

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool enabled_ = false, tty_ = false, finished_ = false;
  int last_quarter_ = -1;
  Callback callback_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

// Whether stderr is a terminal.
bool stderr_is_tty();
// A status line on stderr ("qmoe: ..."), clearing a bar first when on a terminal.
void status_line(const std::string& msg);

}  // namespace qmoe::quantizer_detail
