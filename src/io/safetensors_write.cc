// Writing safetensors files byte-for-byte like the Rust writer, and the shard index
// (checkpoint-format.md §5–6).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "qmoe/error.h"
#include "qmoe/safetensors.h"
#include "util/files.h"

namespace qmoe {

namespace {

// JSON string literal the way serde_json writes it (UTF-8 kept, control characters escaped).
std::string json_string(const std::string& s, std::string_view what, const std::string& path) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("cannot write {}: {} '{}' is not valid UTF-8", path, what, s));
  }
}

using util::AtomicFile;

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const auto& nt : tensors) {
    if (!nt.tensor.defined()) throw Error(fmt::format("cannot write {}: tensor '{}' is undefined", path, nt.name));
    if (nt.name == "__metadata__")
      throw Error(fmt::format("cannot write {}: '__metadata__' is reserved and cannot name a tensor", path));
    if (!names.insert(nt.name).second)
      throw Error(fmt::format("cannot write {}: tensor name '{}' appears twice", path, nt.name));
    const uint64_t bits = static_cast<uint64_t>(nt.tensor.numel()) * static_cast<uint64_t>(dtype_bits(nt.tensor.dtype()));
    if (bits % 8 != 0)
      throw Error(fmt::format("cannot write {}: tensor '{}' of shape {} and dtype {} is not a whole number of bytes",
                              path, nt.name, shape_str(nt.tensor.shape()), dtype_name(nt.tensor.dtype())));
  }

  // Rust writer order: dtype descending (enum order), then name ascending (bytewise).
  std::vector<const NamedTensor*> order;
  for (const auto& nt : tensors) order.push_back(&nt);
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    if (a->tensor.dtype() != b->tensor.dtype()) return a->tensor.dtype() > b->tensor.dtype();
    return a->name < b->name;
  });

  // Compact JSON header: __metadata__ first (omitted when empty), then tensors in data order.
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_kv = true;
    for (const auto& [k, v] : metadata) {
      if (!first_kv) header += ',';
      header += json_string(k, "metadata key", path) + ':' + json_string(v, "metadata value", path);
      first_kv = false;
    }
    header += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const NamedTensor* nt : order) {
    if (!first) header += ',';
    first = false;
    const Tensor& t = nt->tensor;
    std::string shape;
    for (int64_t d : t.shape()) {
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    const uint64_t nbytes = t.nbytes();
    header += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          json_string(nt->name, "tensor name", path), dtype_name(t.dtype()), shape, offset,
                          offset + nbytes);
    offset += nbytes;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  AtomicFile out(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  out.write(len, 8);
  out.write(header.data(), header.size());
  for (const NamedTensor* nt : order) out.write(nt->tensor.data(), nt->tensor.nbytes());
  out.commit();
}

void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size, uint64_t total_parameters) {
  // json.dumps(index, indent=2, sort_keys=True) + "\n" (ensure_ascii, like Python's default).
  nlohmann::json j;
  j["metadata"] = {{"total_parameters", total_parameters}, {"total_size", total_size}};
  j["weight_map"] = nlohmann::json::object();
  for (const auto& [name, file] : weight_map) j["weight_map"][name] = file;
  std::string text;
  try {
    text = j.dump(2, ' ', true) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("cannot write {}: weight_map holds a string that is not valid UTF-8 ({})", path,
                            e.what()));
  }
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace qmoe
