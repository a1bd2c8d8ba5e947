#include "util/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qmoe::util {

std::shared_ptr<void> alloc_uninit(size_t bytes) {
  const bool huge = bytes >= kHugeMin;
  const size_t align = huge ? kHugePage : 64;
  const size_t cap = (std::max<size_t>(bytes, 1) + align - 1) / align * align;  // aligned_alloc: a multiple
  void* p = std::aligned_alloc(align, cap);
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__)
  if (huge) (void)::madvise(p, cap, MADV_HUGEPAGE);  // advice only: 4 KiB pages where THP is off
#endif
  return {p, [](void* q) { std::free(q); }};
}

std::shared_ptr<void> alloc_zeroed(size_t bytes) {
  std::shared_ptr<void> p = alloc_uninit(bytes);
  std::memset(p.get(), 0, bytes);
  return p;
}

}  // namespace qmoe::util
