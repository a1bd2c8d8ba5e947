// libFuzzer target: layer-name pattern matching (exact, glob, `re:` on RE2). The input is
// "PATTERN\nNAME"; the match must finish quickly (libFuzzer's -timeout) and only qmoe::Error may
// escape.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "qmoe/config.h"
#include "qmoe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view pattern = in.substr(0, nl);
  const std::string_view name = nl == std::string_view::npos ? std::string_view("model.layers.0.mlp.experts.0.up_proj")
                                                             : in.substr(nl + 1);
  try {
    (void)qmoe::quark_pattern_matches(pattern, name);
    (void)qmoe::quark_pattern_matches(std::string("re:") + std::string(pattern), name);
  } catch (const qmoe::Error&) {
  }
  return 0;
}
