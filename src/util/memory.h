// Internal: zero-filled heap buffers for tensor storage and the bandwidth probe. A buffer of
// kHugeMin bytes or more is aligned to 2 MiB and advised as transparent-huge-page memory on Linux
// (madvise MADV_HUGEPAGE: effective where THP is "madvise" or "always"), so that streaming the
// expert weights at decode walks one page table entry per 2 MiB instead of per 4 KiB — on a
// virtual machine each TLB miss is a two-level walk (bench/RESULTS.md, 2026-12-03 late:
// qwen3-30b-a3b layers 8–18 % faster at T = 1, 1–8 % at T = 16). Smaller buffers are 64-byte
// aligned.
#pragma once

#include <cstddef>
#include <memory>

namespace qmoe::util {

inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr size_t kHugeMin = 2 * kHugePage;

// `bytes` zero bytes (at least one byte is allocated); throws std::bad_alloc.
std::shared_ptr<void> alloc_zeroed(size_t bytes);
// The same without the zero fill, for buffers the caller writes whole before reading.
std::shared_ptr<void> alloc_uninit(size_t bytes);

}  // namespace qmoe::util
