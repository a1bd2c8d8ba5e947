#include "quant/json_fields.h"

#include <fmt/format.h>

#include <cmath>

#include "qmoe/error.h"
#include "util/json.h"

namespace qmoe::detail {

Json parse_json(std::string_view text, std::string_view where) {
  // ordered_json inserts in time linear in the object's size: bound the members per object.
  return util::parse_json_limited<Json>(text, where, kMaxJsonObjectMembers);
}

std::string json_type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

std::string field_path(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  return fmt::format("{}.{}", path, key);
}

namespace {
const Json* find_field(const Json& obj, std::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const Json& v, std::string_view key, std::string_view path,
                             std::string_view where, std::string_view expected) {
  throw Error(fmt::format("{}: field '{}' must be {} or null, got {} {}", where, field_path(path, key),
                          expected, json_type_name(v), util::json_brief(v)));
}
}  // namespace

std::optional<std::string> opt_string(const Json& obj, std::string_view key, std::string_view path,
                                      std::string_view where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(*v, key, path, where, "a string");
  return v->get<std::string>();
}

std::optional<bool> opt_bool(const Json& obj, std::string_view key, std::string_view path,
                             std::string_view where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(*v, key, path, where, "a boolean");
  return v->get<bool>();
}

std::optional<int64_t> opt_int(const Json& obj, std::string_view key, std::string_view path,
                               std::string_view where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  wrong_type(*v, key, path, where, "an integer");
}

std::optional<double> opt_number(const Json& obj, std::string_view key, std::string_view path,
                                 std::string_view where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(*v, key, path, where, "a number");
  return v->get<double>();
}

bool json_truthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();  // array / object
}

}  // namespace qmoe::detail
