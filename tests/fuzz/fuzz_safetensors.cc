// libFuzzer target: the safetensors header validator (SafetensorsFile::from_bytes). Every input is
// either accepted with all views inside the buffer, or rejected with qmoe::Error; anything else
// (a crash, a sanitizer report, another exception type, a timeout) is a bug. Built by
// -DQMOE_FUZZ=ON with clang; .ci/run runs it on tests/fuzz/corpus/safetensors.
#include <cstddef>
#include <cstdint>

#include "qmoe/error.h"
#include "qmoe/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = qmoe::SafetensorsFile::from_bytes(nullptr, data, size, "fuzz-input");
    unsigned sum = 0;
    uint64_t covered = 0;
    for (const auto& t : f->tensors()) {
      const qmoe::Tensor v = f->get(t.name);
      if (v.nbytes() != t.end - t.begin) __builtin_trap();
      covered += v.nbytes();
      for (size_t i = 0; i < v.nbytes(); ++i) sum += static_cast<unsigned>(v.data()[i]);  // ASan checks bounds
    }
    // §6: the ranges tile the data buffer exactly.
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // from_bytes checked size >= 8
    if (covered != size - 8 - header_len) __builtin_trap();
    (void)sum;
  } catch (const qmoe::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
