// STREAM-like memory read bandwidth of this machine, measured with the kernels' thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qmoe::cpu {

struct BandwidthResult {
  double median_gbps = 0.0;  // 1e9 bytes / s
  double max_gbps = 0.0;
  size_t bytes = 0;          // size of the buffer read per run
  int runs = 0;
};

// Reads a `bytes` buffer (≥ 512 MB recommended: far beyond the last-level cache) `runs` times
// with `threads` threads (≤ 0: all cores), each summing a contiguous slice; reports the median.
BandwidthResult measure_read_bandwidth(int threads, size_t bytes = size_t{512} << 20, int runs = 5);

// Evicts the caches by reading `bytes` of a private buffer (between benchmark repetitions).
void flush_caches(size_t bytes = size_t{64} << 20);

// The last-level cache of this machine, from sysfs (/sys/devices/system/cpu/cpu*/cache/index*):
// the highest level's size summed over its distinct instances (shared_cpu_list). Without sysfs:
// 32 MiB, from_sysfs = false.
struct CacheInfo {
  int64_t llc_bytes = int64_t{32} << 20;
  int level = 0;
  int instances = 0;
  bool from_sysfs = false;
};
CacheInfo last_level_cache();
// "model name" of /proc/cpuinfo ("unknown CPU" without it).
std::string cpu_model_name();

}  // namespace qmoe::cpu
