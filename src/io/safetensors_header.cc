#include "io/safetensors_header.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "qmoe/error.h"

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
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
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

void check_overlaps(const std::vector<TensorInfo>& tensors, const HeaderContext& ctx) {
  std::vector<const TensorInfo*> ranges;
  for (const auto& t : tensors)
    if (t.end > t.begin) ranges.push_back(&t);  // empty tensors own no bytes
  std::sort(ranges.begin(), ranges.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const TensorInfo& a = *ranges[i - 1];
    const TensorInfo& b = *ranges[i];
    if (a.end > b.begin)
      throw Error(fmt::format("tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap in {}",
                              a.name, a.begin, a.end, b.name, b.begin, b.end, ctx.file));
  }
}

}  // namespace

ParsedHeader parse_safetensors_header(std::string_view header, const HeaderContext& ctx) {
  check_nesting(header, ctx);

  // Top-level keys in header order (nlohmann::json sorts object keys; the callback sees them as read).
  std::vector<std::string> order;
  json root;
  try {
    root = json::parse(header.begin(), header.end(), [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key) order.push_back(parsed.get<std::string>());
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(fmt::format("invalid JSON header in {}: {}", ctx.file, e.what()));
  }
  if (!root.is_object())
    throw Error(fmt::format("invalid JSON header in {}: expected a JSON object, found {}", ctx.file,
                            root.type_name()));

  ParsedHeader out;
  std::set<std::string_view> seen;  // duplicate keys: nlohmann keeps the last value, listed once
  for (const std::string& key : order) {
    if (!seen.insert(key).second) continue;
    const json& v = root.at(key);
    if (key == "__metadata__") {
      parse_metadata(v, ctx, out.metadata);
    } else {
      out.tensors.push_back(parse_tensor(key, v, ctx));
    }
  }
  check_overlaps(out.tensors, ctx);
  return out;
}

}  // namespace qmoe::io
