#include "io/safetensors_header.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "qmoe/error.h"
#include "util/json.h"

namespace qmoe::io {

namespace {

using nlohmann::json;

// A valid header nests at most 3 levels ({name: {shape: [..]}}); anything far deeper is
// rejected before parsing so hostile input cannot make the parser build huge nested trees.
constexpr int kMaxJsonDepth = 32;

void check_nesting(std::string_view s, const HeaderContext& ctx) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth)
        throw Error(fmt::format("invalid JSON header in {}: nested deeper than {} levels (a safetensors header "
                                "nests at most 3)",
                                ctx.file, kMaxJsonDepth));
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

// Non-negative JSON integer as uint64, nullopt for anything else (floats, negatives, strings...).
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= 0) return static_cast<uint64_t>(x);
  }
  return std::nullopt;
}

std::string brief(const json& v) {
  return util::json_brief(v);
}

void parse_metadata(const json& v, const HeaderContext& ctx, std::map<std::string, std::string>& out) {
  if (!v.is_object())
    throw Error(fmt::format("__metadata__ in {} must be a JSON object of strings, found {} {}", ctx.file,
                            v.type_name(), brief(v)));
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string())
      throw Error(fmt::format("__metadata__ entry '{}' in {} must be a string, found {} {}", k, ctx.file,
                              val.type_name(), brief(val)));
    out[k] = val.get<std::string>();
  }
}

const json& field(const json& v, const char* key, const std::string& name, const HeaderContext& ctx) {
  auto it = v.find(key);
  if (it == v.end())
    throw Error(fmt::format("tensor '{}' in {} has no \"{}\" field (expected dtype, shape, data_offsets)", name,
                            ctx.file, key));
  return *it;
}

TensorInfo parse_tensor(const std::string& name, const json& v, const HeaderContext& ctx) {
  if (!v.is_object())
    throw Error(fmt::format("tensor '{}' in {} must be a JSON object with dtype, shape, data_offsets; found {} {}",
                            name, ctx.file, v.type_name(), brief(v)));
  TensorInfo info;
  info.name = name;

  const json& dt = field(v, "dtype", name, ctx);
  if (!dt.is_string())
    throw Error(fmt::format("tensor '{}' in {}: dtype must be a string, found {}", name, ctx.file, brief(dt)));
  const auto dtype = dtype_from_name(dt.get_ref<const std::string&>());
  if (!dtype)
    throw Error(fmt::format("tensor '{}' in {}: unknown dtype {} (expected one of BOOL, F4, F6_E2M3, F6_E3M2, U8, "
                            "I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64)",
                            name, ctx.file, brief(dt)));
  info.dtype = *dtype;

  const json& sh = field(v, "shape", name, ctx);
  if (!sh.is_array())
    throw Error(fmt::format("tensor '{}' in {}: shape must be an array of non-negative integers, found {}", name,
                            ctx.file, brief(sh)));
  int64_t numel = 1;
  for (const json& d : sh) {
    const auto dim = as_u64(d);
    if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(fmt::format("tensor '{}' in {}: shape {} must hold non-negative integers, found {}", name,
                              ctx.file, brief(sh), brief(d)));
    info.shape.push_back(static_cast<int64_t>(*dim));
    // Same multiplication order as shape_numel(), so an accepted shape never overflows there.
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(*dim), &numel))
      throw Error(fmt::format("tensor '{}' in {}: the element count of shape {} overflows 64 bits", name,
                              ctx.file, brief(sh)));
  }
  const int bits = dtype_bits(info.dtype);
  if (numel > std::numeric_limits<int64_t>::max() / 64)
    throw Error(fmt::format("tensor '{}' in {}: shape {} is too large ({} elements)", name, ctx.file,
                            shape_str(info.shape), numel));
  const uint64_t total_bits = static_cast<uint64_t>(numel) * static_cast<uint64_t>(bits);

  const json& off = field(v, "data_offsets", name, ctx);
  std::optional<uint64_t> begin, end;
  if (off.is_array() && off.size() == 2) {
    begin = as_u64(off[0]);
    end = as_u64(off[1]);
  }
  if (!begin || !end || *begin > *end)
    throw Error(fmt::format("tensor '{}' in {}: data_offsets must be [begin, end] with 0 <= begin <= end, found {}",
                            name, ctx.file, brief(off)));
  info.begin = *begin;
  info.end = *end;

  if (total_bits % 8 != 0)
    throw Error(fmt::format("tensor '{}' in {}: shape {} with dtype {} has {} elements x {} bits = {} bits, not a "
                            "whole number of bytes",
                            name, ctx.file, shape_str(info.shape), dtype_name(info.dtype), numel, bits, total_bits));
  const uint64_t expected = total_bits / 8;
  if (info.end - info.begin != expected)
    throw Error(fmt::format("tensor '{}' in {}: shape {} with dtype {} needs {} bytes but data_offsets [{}, {}] "
                            "span {} bytes",
                            name, ctx.file, shape_str(info.shape), dtype_name(info.dtype), expected, info.begin,
                            info.end, info.end - info.begin));
  if (info.end > ctx.data_size)
    throw Error(fmt::format("{} is truncated: tensor '{}' has data_offsets [{}, {}] but the data buffer holds only "
                            "{} bytes (file size {}, header {} bytes)",
                            ctx.file, name, info.begin, info.end, ctx.data_size, ctx.file_size, ctx.header_len));
  return info;
}

// checkpoint-format.md §6: the byte ranges, sorted, tile the data buffer exactly: the first
// begins at 0, each begins where the previous ends (empty tensors included), the last ends at the
// buffer's end. O(N log N) in the number of tensors.
void check_layout(const std::vector<TensorInfo>& tensors, const HeaderContext& ctx) {
  std::vector<const TensorInfo*> ranges;
  ranges.reserve(tensors.size());
  for (const auto& t : tensors) ranges.push_back(&t);
  std::sort(ranges.begin(), ranges.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : ranges) {
    if (t->begin < pos)
      throw Error(fmt::format("tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap in {}",
                              prev->name, prev->begin, prev->end, t->name, t->begin, t->end, ctx.file));
    if (t->begin > pos)
      throw Error(fmt::format("{}: {} unused bytes [{}, {}) in the data buffer before tensor '{}' (data_offsets "
                              "[{}, {}]); expected contiguous tensors from offset 0 with no gaps",
                              ctx.file, t->begin - pos, pos, t->begin, t->name, t->begin, t->end));
    pos = t->end;
    prev = t;
  }
  if (pos != ctx.data_size)
    throw Error(fmt::format("{}: {} bytes after the last tensor{} (the tensors end at offset {}, the data buffer "
                            "holds {} bytes: file size {}, header {} bytes); expected the last tensor to end at the "
                            "end of the file",
                            ctx.file, ctx.data_size - pos, prev ? fmt::format(" '{}'", prev->name) : std::string(),
                            pos, ctx.data_size, ctx.file_size, ctx.header_len));
}

// The top-level keys of a JSON object text that has already parsed, in file order
// (nlohmann::json sorts keys, so the order is recovered here). Linear in the text; each key is
// decoded (escapes) by the JSON parser.
std::vector<std::string> top_level_keys(std::string_view s) {
  std::vector<std::string> keys;
  int depth = 0;
  bool expect_key = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
      j = std::min(j, s.size() - 1);
      if (depth == 1 && expect_key) {
        keys.push_back(json::parse(s.substr(i, j - i + 1)).get<std::string>());
        expect_key = false;
      }
      i = j;
    } else if (c == '{' || c == '[') {
      if (++depth == 1) expect_key = c == '{';
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 1) {
      expect_key = true;
    }
  }
  return keys;
}

}  // namespace

ParsedHeader parse_safetensors_header(std::string_view header, const HeaderContext& ctx) {
  // nlohmann's parser takes a NUL byte for the end of input, so "{}\0{...}" would parse as an
  // empty header. NUL padding at the end is tolerated; a NUL followed by anything else is an error.
  if (const size_t nul = header.find('\0'); nul != std::string_view::npos) {
    if (header.find_first_not_of('\0', nul) != std::string_view::npos)
      throw Error(fmt::format("invalid JSON header in {}: a NUL byte at header offset {} is followed by more text "
                              "(expected UTF-8 JSON, padded with spaces)",
                              ctx.file, nul));
    header = header.substr(0, nul);
  }
  check_nesting(header, ctx);

  // No parser callback: nlohmann's callback parser rescans the enclosing object at every nested
  // object's end, O(N²) in the number of tensors (80k tensors took minutes).
  json root;
  std::vector<std::string> order;
  try {
    root = json::parse(header.begin(), header.end());
    if (!root.is_object())
      throw Error(fmt::format("invalid JSON header in {}: expected a JSON object, found {}", ctx.file,
                              root.type_name()));
    order = top_level_keys(header);
  } catch (const json::exception& e) {
    throw Error(fmt::format("invalid JSON header in {}: {}", ctx.file, util::json_error_text(e)));
  }

  ParsedHeader out;
  std::set<std::string_view> seen;  // nlohmann keeps the last value of a duplicated key
  for (const std::string& key : order) {
    if (!seen.insert(key).second)
      throw Error(fmt::format("invalid JSON header in {}: the key '{}' appears more than once (tensor names must be "
                              "unique)",
                              ctx.file, key));
    const auto it = root.find(key);
    if (it == root.end())
      throw Error(fmt::format("invalid JSON header in {}: cannot read the entry '{}'", ctx.file, key));
    const json& v = *it;
    if (key == "__metadata__") {
      parse_metadata(v, ctx, out.metadata);
    } else {
      out.tensors.push_back(parse_tensor(key, v, ctx));
    }
  }
  check_layout(out.tensors, ctx);
  return out;
}

}  // namespace qmoe::io
