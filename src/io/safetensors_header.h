// Internal: validation of a safetensors JSON header against the size of its data buffer
// (checkpoint-format.md §6). Used by SafetensorsFile; not part of the public API.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/safetensors.h"

namespace qmoe::io {

// Largest header accepted (the reference reader's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct ParsedHeader {
  std::vector<TensorInfo> tensors;  // in header order
  std::map<std::string, std::string> metadata;
};

// Where the header came from, for messages.
struct HeaderContext {
  std::string file;        // file path or buffer name
  uint64_t file_size = 0;  // whole file, bytes
  uint64_t header_len = 0; // N, the JSON header's length
  uint64_t data_size = 0;  // bytes after the header (file_size - 8 - N)
};

// Parse and validate the whole header: JSON object; "__metadata__" a string→string object;
// every other key a tensor {dtype, shape, data_offsets} with a known dtype, non-negative
// shape whose element count × bit size is a whole number of bytes equal to end − begin, a
// range inside the data buffer; keys unique; the ranges contiguous from 0 to the end of the
// buffer (no gap, no overlap, no trailing bytes). Throws qmoe::Error naming the file and tensor.
ParsedHeader parse_safetensors_header(std::string_view header, const HeaderContext& ctx);

}  // namespace qmoe::io
