// Checkpoint: the tensors of a checkpoint directory, through model.safetensors.index.json,
// model.safetensors, or every *.safetensors file (checkpoint-format.md §5).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "qmoe/error.h"
#include "qmoe/safetensors.h"
#include "util/files.h"
#include "util/json.h"

namespace qmoe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// True when `p` exists as a regular file (following links); false when it does not exist;
// qmoe::Error when it exists as anything else, so it is never skipped silently.
bool regular_file_or_absent(const fs::path& p, std::string_view role) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec || st.type() == fs::file_type::not_found) return false;
  if (st.type() == fs::file_type::regular) return true;
  const std::string kind = util::describe_non_regular(p.string());
  throw Error(fmt::format("{} {} is {}; expected a regular file", role, p.string(),
                          kind.empty() ? std::string("not a regular file") : kind));
}

// weight_map of an index file: tensor name → shard file name (a plain name inside the directory).
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string text =
      util::read_regular_file(index_path.string(), "checkpoint index", util::kMaxJsonFileBytes);
  const nlohmann::json j =
      util::parse_json_limited<nlohmann::json>(text, fmt::format("checkpoint index {}", index_path.string()));
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(fmt::format("checkpoint index {} must be a JSON object with a \"weight_map\" object (tensor name -> "
                            "shard file)",
                            index_path.string()));
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw Error(fmt::format("checkpoint index {}: weight_map entry for '{}' must be a file name string, found {}",
                              index_path.string(), name, file.type_name()));
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos)
      throw Error(fmt::format("checkpoint index {}: weight_map entry for '{}' names '{}', expected a file name "
                              "inside the checkpoint directory",
                              index_path.string(), name, f));
    out.emplace(name, f);
  }
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format("checkpoint directory {} does not exist or is not a directory", dir));
  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);

  if (regular_file_or_absent(root / kIndexName, "checkpoint index")) {
    const fs::path index_path = root / kIndexName;
    const auto weight_map = read_weight_map(index_path);
    std::map<std::string, size_t> file_idx;
    for (const auto& [name, file] : weight_map) file_idx.emplace(file, 0);
    for (auto& [file, idx] : file_idx) {
      const fs::path p = root / file;
      if (!regular_file_or_absent(p, fmt::format("shard listed in checkpoint index {}:", index_path.string())))
        throw Error(fmt::format("shard {} listed in checkpoint index {} is missing", p.string(), index_path.string()));
      idx = ck.files_.size();
      ck.files_.push_back(SafetensorsFile::open(p.string()));
    }
    for (const auto& [name, file] : weight_map) {
      const size_t idx = file_idx.at(file);
      if (!ck.files_[idx]->find(name))
        throw Error(fmt::format("tensor '{}' is listed in checkpoint index {} for shard {} but is not in that file",
                                name, index_path.string(), ck.files_[idx]->path()));
      ck.where_.emplace(name, idx);
    }
    return ck;
  }

  std::vector<fs::path> paths;
  if (regular_file_or_absent(root / kSingleName, "checkpoint file")) {
    paths.push_back(root / kSingleName);
  } else {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.path().extension() == ".safetensors" && regular_file_or_absent(entry.path(), "checkpoint file"))
        paths.push_back(entry.path());
    }
    if (ec) throw Error(fmt::format("cannot list checkpoint directory {}: {}", dir, ec.message()));
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty())
    throw Error(fmt::format("no safetensors files in {} (expected {}, {} or *.safetensors)", dir, kIndexName,
                            kSingleName));
  for (const auto& p : paths) {
    const size_t idx = ck.files_.size();
    ck.files_.push_back(SafetensorsFile::open(p.string()));
    for (const auto& t : ck.files_.back()->tensors()) {
      auto [it, inserted] = ck.where_.emplace(t.name, idx);
      if (!inserted)
        throw Error(fmt::format("tensor '{}' appears in both {} and {} in checkpoint {}", t.name,
                                ck.files_[it->second]->path(), p.string(), dir));
    }
  }
  return ck;
}

bool Checkpoint::has(std::string_view name) const { return where_.find(name) != where_.end(); }

const TensorInfo* Checkpoint::info(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second]->find(name);
}

Tensor Checkpoint::get(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(fmt::format("tensor '{}' not found in checkpoint {}", name, dir_));
  return files_[it->second]->get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

void Checkpoint::release_prefix(std::string_view prefix) const {
  for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.starts_with(prefix); ++it)
    files_[it->second]->release(it->first);
}

std::string Checkpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : files_[it->second]->path();
}

}  // namespace qmoe
