// Internal: JSON parsing with a nesting limit and messages that never serialise unbounded input.
// Header-only over nlohmann::json / ordered_json (the libraries link nlohmann privately).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/error.h"

namespace qmoe::util {

// Deepest nesting of arrays / objects accepted anywhere (config.json nests ~6 levels).
constexpr int kMaxJsonDepth = 128;

// One linear pass over the JSON text's structure (strings skipped, no recursion), run before the
// parser so that hostile input never builds a deep tree or a huge key-ordered object: the byte
// offset of the first '[' / '{' nested deeper than `max_depth`, and of the first ',' that gives
// an object more than `max_members` members (0: unchecked; for nlohmann::ordered_json, whose
// insertion is linear in the object's size); npos where there is none.
struct JsonShapeViolations {
  size_t too_deep = std::string_view::npos;
  size_t too_many_members = std::string_view::npos;
};
inline JsonShapeViolations json_shape_violations(std::string_view s, int max_depth, size_t max_members) {
  JsonShapeViolations v;
  std::vector<size_t> commas;  // per open level: commas seen (objects), or npos for arrays
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (static_cast<int>(commas.size()) >= max_depth && v.too_deep == std::string_view::npos) v.too_deep = i;
      if (v.too_deep != std::string_view::npos && max_members == 0) break;  // nothing more to learn
      commas.push_back(c == '{' ? 0 : std::string_view::npos);
    } else if (c == '}' || c == ']') {
      if (!commas.empty()) commas.pop_back();
    } else if (c == ',' && max_members > 0 && !commas.empty() && commas.back() != std::string_view::npos) {
      if (++commas.back() >= max_members && v.too_many_members == std::string_view::npos) v.too_many_members = i;
    }
  }
  return v;
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag, clipped to 200 bytes.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  if (s.size() > 200) s = s.substr(0, 197) + "...";
  return s;
}

// Parse `text` (named `where` in messages) as JSON nested at most kMaxJsonDepth deep. Every
// failure is a qmoe::Error "WHERE: invalid JSON ...".
template <class JsonT>
JsonT parse_json_limited(std::string_view text, std::string_view where, size_t max_object_members = 0) {
  const JsonShapeViolations shape = json_shape_violations(text, kMaxJsonDepth, max_object_members);
  if (shape.too_many_members != std::string_view::npos)
    throw Error(fmt::format("{}: invalid JSON (byte {}): an object with more than {} members (implausible for "
                            "this file)",
                            where, shape.too_many_members, max_object_members));
  // nlohmann stops at a NUL byte as if the input ended there: the rest would be ignored silently.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw Error(fmt::format("{}: invalid JSON (byte {}): a NUL byte; expected UTF-8 JSON text", where, nul));
  if (shape.too_deep != std::string_view::npos)
    throw Error(fmt::format("{}: invalid JSON (byte {}): arrays / objects nested deeper than {} levels", where,
                            shape.too_deep, kMaxJsonDepth));
  try {
    return JsonT::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{}: invalid JSON (byte {}): {}", where, e.byte, json_error_text(e)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", where, json_error_text(e)));
  }
}

namespace detail_json {
template <class JsonT>
void brief_into(const JsonT& v, std::string& out, size_t budget, int depth) {
  if (out.size() > budget) return;
  if (v.is_array() || v.is_object()) {
    const bool obj = v.is_object();
    if (depth >= 4) {
      out += obj ? "{...}" : "[...]";
      return;
    }
    out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out.size() > budget) break;
      if (!first) out += ',';
      first = false;
      if (obj) {
        out += JsonT(it.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        out += ':';
      }
      brief_into(*it, out, budget, depth + 1);
    }
    out += obj ? '}' : ']';
    return;
  }
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > budget) s = s.substr(0, budget);
  out += s;
}
}  // namespace detail_json

// A short rendering of `v` for messages: at most about `max_chars` characters, nesting cut at 4
// levels, invalid UTF-8 replaced. Never walks more of `v` than it prints.
template <class JsonT>
std::string json_brief(const JsonT& v, size_t max_chars = 80) {
  std::string out;
  detail_json::brief_into(v, out, max_chars, 0);
  if (out.size() > max_chars) out = out.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return out;
}

}  // namespace qmoe::util
