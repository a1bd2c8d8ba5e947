// The in-process group: n communicators over one shared mailbox, driven by n threads. Host memory by
// default; the CUDA test double passes device copy / synchronise hooks (src/cuda/dist_cuda.cu).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "qmoe/dist.h"

namespace qmoe::dist {

struct MemoryOps {
  bool device = false;
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;  // null: std::memcpy
  void (*sync)(void* stream) = nullptr;                              // before a rank posts its buffers
};

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int n, const MemoryOps& ops);

}  // namespace qmoe::dist
