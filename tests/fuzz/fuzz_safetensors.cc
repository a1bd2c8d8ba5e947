// libFuzzer target for the safetensors header validator. Not built by CMake (the default
// toolchain is gcc); build by hand with clang from the repository root:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
//     tests/fuzz/fuzz_safetensors.cc src/io/*.cc src/formats/*.cc -lfmt -o fuzz_safetensors
//   ./fuzz_safetensors -max_len=4096 -max_total_time=60 CORPUS_DIR
// Seed CORPUS_DIR with small valid files (e.g. written by tests/io, or conformance io.safetensors).
#include <cstddef>
#include <cstdint>

#include "qmoe/error.h"
#include "qmoe/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = qmoe::SafetensorsFile::from_bytes(nullptr, data, size, "fuzz-input");
    unsigned sum = 0;
    for (const auto& t : f->tensors()) {
      const qmoe::Tensor v = f->get(t.name);
      if (v.nbytes() != t.end - t.begin) __builtin_trap();
      for (size_t i = 0; i < v.nbytes(); ++i) sum += static_cast<unsigned>(v.data()[i]);  // ASan checks bounds
    }
    (void)sum;
  } catch (const qmoe::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
