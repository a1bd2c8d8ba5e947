// Progress bar / progress lines on stderr.
#include "quantizer/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace qmoe::quantizer_detail {

bool stderr_is_tty() { return isatty(fileno(stderr)) != 0; }

void status_line(const std::string& msg) {
  if (stderr_is_tty())
    std::fprintf(stderr, "\r\033[K%s\n", msg.c_str());
  else
    std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
}

Progress::Progress(std::string label, uint64_t total, bool enabled, Callback callback)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled || callback),
      tty_(enabled && !callback && stderr_is_tty()),
      callback_(std::move(callback)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (enabled_) draw(false);
}

Progress::~Progress() {
  // A callback is not called from the destructor (it may throw, and the job is being unwound
  // when finish() was not reached).
  if (!callback_) finish();
}

void Progress::add(uint64_t done) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += done;
  if (done_ > total_) done_ = total_;
  draw(false);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  done_ = total_;
  draw(true);
}

void Progress::draw(bool final) {
  if (callback_) {
    callback_(label_, done_, total_);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ == 0 ? 1.0 : static_cast<double>(done_) / static_cast<double>(total_);
  if (tty_) {
    if (!final && std::chrono::duration<double>(now - last_draw_).count() < 0.1 && done_ != 0) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3d%% %.1fs%s", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
                 secs, final ? "\n" : "");
  } else {
    const int quarter = static_cast<int>(frac * 4);
    if (quarter == last_quarter_ && !final) return;
    if (final && last_quarter_ == 4) return;
    last_quarter_ = quarter;
    std::fprintf(stderr, "%s: %d%% (%.1fs)\n", label_.c_str(), quarter * 25, secs);
  }
  std::fflush(stderr);
}

}  // namespace qmoe::quantizer_detail
