#include "util/memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qmoe::util {

namespace {

std::shared_ptr<void> heap(size_t bytes, size_t align) {
  const size_t cap = (std::max<size_t>(bytes, 1) + align - 1) / align * align;  // aligned_alloc: a multiple
  void* p = std::aligned_alloc(align, cap);
  if (p == nullptr) throw std::bad_alloc();
  return {p, [](void* q) { std::free(q); }};
}

#if defined(__linux__)
// Fresh anonymous pages (zero), 2 MiB aligned: map 2 MiB more and unmap the ends.
std::shared_ptr<void> huge_mapping(size_t bytes) {
  const size_t cap = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* m = ::mmap(nullptr, cap + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (raw + kHugePage - 1) / kHugePage * kHugePage;
  if (start > raw) ::munmap(m, start - raw);
  const size_t tail = raw + cap + kHugePage - (start + cap);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(start + cap), tail);
  void* p = reinterpret_cast<void*>(start);
  (void)::madvise(p, cap, MADV_HUGEPAGE);  // advice only: 4 KiB pages where THP is off
  return {p, [cap](void* q) { ::munmap(q, cap); }};
}
#endif

}  // namespace

std::shared_ptr<void> alloc_zeroed(size_t bytes) {
#if defined(__linux__)
  if (bytes >= kHugeMin) return huge_mapping(bytes);  // the kernel hands out zeroed pages
#endif
  std::shared_ptr<void> p = heap(bytes, 64);
  std::memset(p.get(), 0, bytes);
  return p;
}

std::shared_ptr<void> alloc_uninit(size_t bytes) {
#if defined(__linux__)
  if (bytes >= kHugeMin) return huge_mapping(bytes);
#endif
  return heap(bytes, bytes >= kHugeMin ? kHugePage : 64);
}

}  // namespace qmoe::util
