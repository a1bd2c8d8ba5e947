// Internal helpers for reading JSON fields with precise error messages (quant module only).
// Every getter names the file (`where`) and the field path in its error.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qmoe::detail {

// Keeps the file's key order (layer_quant_config is matched in file order).
using Json = nlohmann::ordered_json;

// Members per JSON object accepted in config.json / quantization_config (real ones: < 1000).
constexpr size_t kMaxJsonObjectMembers = 20000;

// Parse JSON text (nesting and object sizes bounded); a syntax error names `where` and the byte offset.
Json parse_json(std::string_view text, std::string_view where);

// "null", "boolean", "integer", "number", "string", "array", "object".
std::string json_type_name(const Json& v);

// "path.key" (or "key" when path is empty).
std::string field_path(std::string_view path, std::string_view key);

// Optional fields: nullopt when the key is absent or null; throws qmoe::Error when present with
// the wrong type. `obj` must be an object.
std::optional<std::string> opt_string(const Json& obj, std::string_view key, std::string_view path,
                                      std::string_view where);
std::optional<bool> opt_bool(const Json& obj, std::string_view key, std::string_view path,
                             std::string_view where);
// Integers; a float with an integral value (e.g. 32.0) is accepted.
std::optional<int64_t> opt_int(const Json& obj, std::string_view key, std::string_view path,
                               std::string_view where);
std::optional<double> opt_number(const Json& obj, std::string_view key, std::string_view path,
                                 std::string_view where);

// Python truthiness of a JSON value (null, false, 0, "", [] and {} are falsy).
bool json_truthy(const Json& v);

}  // namespace qmoe::detail
