// Checkpoint: sharded index, single file, directory glob, and their errors; conformance data.
#include <gtest/gtest.h>

#include <cctype>
#include <nlohmann/json.hpp>

#include "io_test_util.h"

namespace qmoe::test {
namespace {

#define EXPECT_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << "message: " << (msg)

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// Two shards (a, b | c, extra) and an index listing a, b, c.
void write_sharded(const TempDir& dir) {
  write_safetensors(dir.file(kShard1), {{"a", Tensor::from_f32({1.f, 2.f}, {2})}, {"b", Tensor::from_f32({3.f}, {1})}});
  write_safetensors(dir.file(kShard2),
                    {{"c", Tensor::from_f32({4.f, 5.f, 6.f}, {3})}, {"extra", Tensor::from_f32({7.f}, {1})}});
  write_safetensors_index(dir.file("model.safetensors.index.json"), {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}},
                          24, 6);
}

TEST(Checkpoint, ShardedIndex) {
  TempDir dir;
  write_sharded(dir);
  write_safetensors(dir.file("unlisted.safetensors"), {{"zzz", Tensor::from_f32({1.f}, {1})}});
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck.dir(), dir.path().string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));  // the index is authoritative
  EXPECT_TRUE(ck.has("c"));
  EXPECT_FALSE(ck.has("extra"));
  EXPECT_FALSE(ck.has("zzz"));
  EXPECT_EQ(ck.file_of("a"), dir.file(kShard1));
  EXPECT_EQ(ck.file_of("c"), dir.file(kShard2));
  EXPECT_EQ(ck.file_of("nope"), "");
  ASSERT_NE(ck.info("c"), nullptr);
  EXPECT_EQ(ck.info("c")->shape, (Shape{3}));
  EXPECT_EQ(ck.info("nope"), nullptr);
  EXPECT_EQ(ck.get("c").data_as<float>()[2], 6.f);
  EXPECT_EQ(ck.get("b").data_as<float>()[0], 3.f);
  const std::string m = error_of([&] { ck.get("nope"); });
  EXPECT_EQ(m, "tensor 'nope' not found in checkpoint " + dir.path().string());
}

TEST(Checkpoint, IndexErrors) {
  {
    TempDir dir;
    write_sharded(dir);
    fs::remove(dir.file(kShard2));
    const std::string m = error_of([&] { Checkpoint::open(dir.path().string()); });
    EXPECT_HAS(m, kShard2);
    EXPECT_HAS(m, "missing");
  }
  {
    TempDir dir;
    write_sharded(dir);
    write_safetensors_index(dir.file("model.safetensors.index.json"), {{"a", kShard1}, {"c", kShard1}}, 0, 0);
    const std::string m = error_of([&] { Checkpoint::open(dir.path().string()); });
    EXPECT_HAS(m, "tensor 'c'");
    EXPECT_HAS(m, "not in that file");
    EXPECT_HAS(m, kShard1);
  }
  {
    TempDir dir;
    write_sharded(dir);
    fs::resize_file(dir.file(kShard2), fs::file_size(dir.file(kShard2)) - 2);
    EXPECT_HAS(error_of([&] { Checkpoint::open(dir.path().string()); }), "truncated");
  }
  auto index_error = [](const std::string& text) {
    TempDir dir;
    write_sharded(dir);
    write_bytes(dir.file("model.safetensors.index.json"), std::vector<uint8_t>(text.begin(), text.end()));
    return error_of([&] { Checkpoint::open(dir.path().string()); });
  };
  EXPECT_HAS(index_error("{not json"), "checkpoint index");
  EXPECT_HAS(index_error("[]"), "\"weight_map\"");
  EXPECT_HAS(index_error(R"({"metadata":{}})"), "\"weight_map\"");
  EXPECT_HAS(index_error(R"({"weight_map":[]})"), "\"weight_map\"");
  EXPECT_HAS(index_error(R"({"weight_map":{"a":1}})"), "weight_map entry for 'a'");
  EXPECT_HAS(index_error(R"({"weight_map":{"a":"../x.safetensors"}})"), "inside the checkpoint directory");
  EXPECT_HAS(index_error(R"({"weight_map":{"a":"/etc/passwd"}})"), "inside the checkpoint directory");
  EXPECT_EQ(index_error(R"({"weight_map":{}})"), "");  // an empty checkpoint is not an I/O error
}

TEST(Checkpoint, SingleFileWinsOverOthers) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"w", Tensor::from_f32({1.f}, {1})}});
  write_safetensors(dir.file("io.safetensors"), {{"w", Tensor::from_f32({2.f}, {1})}, {"x", Tensor::from_f32({3.f}, {1})}});
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"w"}));
  EXPECT_EQ(ck.get("w").data_as<float>()[0], 1.f);
}

TEST(Checkpoint, GlobsAllSafetensorsFiles) {
  TempDir dir;
  write_safetensors(dir.file("b.safetensors"), {{"y", Tensor::from_f32({2.f}, {1})}});
  write_safetensors(dir.file("a.safetensors"), {{"x", Tensor::from_f32({1.f}, {1})}});
  write_bytes(dir.file("notes.txt"), {'h', 'i'});
  fs::create_directory(dir.path() / "sub.safetensors");  // a directory: an error, never skipped (issue #10)
  EXPECT_HAS(error_of([&] { Checkpoint::open(dir.path().string()); }), "sub.safetensors is a directory");
  fs::remove(dir.path() / "sub.safetensors");
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ck.file_of("x"), dir.file("a.safetensors"));
  EXPECT_EQ(ck.get("y").data_as<float>()[0], 2.f);

  write_safetensors(dir.file("c.safetensors"), {{"x", Tensor::from_f32({3.f}, {1})}});
  const std::string m = error_of([&] { Checkpoint::open(dir.path().string()); });
  EXPECT_HAS(m, "tensor 'x' appears in both");
  EXPECT_HAS(m, "a.safetensors");
  EXPECT_HAS(m, "c.safetensors");
}

TEST(Checkpoint, NoFilesOrNoDirectory) {
  TempDir dir;
  write_bytes(dir.file("config.json"), {'{', '}'});
  EXPECT_HAS(error_of([&] { Checkpoint::open(dir.path().string()); }), "no safetensors files in " + dir.path().string());
  EXPECT_HAS(error_of([&] { Checkpoint::open(dir.file("missing")); }), "does not exist");
  EXPECT_HAS(error_of([&] { Checkpoint::open(dir.file("config.json")); }), "not a directory");
}

// ---- conformance data ------------------------------------------------------------------------

TEST(ConformanceIo, TruncatedSafetensorsFailsToOpen) {
  const std::string case_dir = conformance_dir() + "err_truncated_safetensors";
  std::ifstream in(case_dir + "/case.json");
  const auto case_json = nlohmann::json::parse(in);
  const auto keywords = case_json.at("error_keywords").get<std::vector<std::string>>();
  ASSERT_FALSE(keywords.empty());
  auto check = [&](const std::string& m) {
    ASSERT_FALSE(m.empty()) << "opening the truncated file must fail";
    std::string lower = m;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool any = false;
    for (const auto& k : keywords) any = any || lower.find(k) != std::string::npos;
    EXPECT_TRUE(any) << m;
    EXPECT_HAS(m, "truncated");
    EXPECT_HAS(m, "model.safetensors");
  };
  check(error_of([&] { SafetensorsFile::open(case_dir + "/model.safetensors"); }));
  check(error_of([&] { Checkpoint::open(case_dir); }));
  EXPECT_NO_THROW(SafetensorsFile::open(case_dir + "/io.safetensors"));
}

TEST(ConformanceIo, AllOtherCasesOpen) {
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(conformance_dir())) {
    if (!entry.is_directory() || entry.path().filename() == "err_truncated_safetensors") continue;
    SCOPED_TRACE(entry.path().string());
    for (const char* file : {"model.safetensors", "io.safetensors"}) {
      auto f = SafetensorsFile::open((entry.path() / file).string());
      EXPECT_FALSE(f->tensors().empty());
      EXPECT_EQ(f->metadata().at("format"), "pt");
      for (const auto& t : f->tensors()) EXPECT_EQ(f->get(t.name).nbytes(), t.end - t.begin);
    }
    Checkpoint ck = Checkpoint::open(entry.path().string());
    EXPECT_EQ(ck.file_of(ck.names().at(0)), (entry.path() / "model.safetensors").string());
    EXPECT_FALSE(ck.has("hidden_states"));  // io.safetensors is not part of the checkpoint
    ++cases;
  }
  EXPECT_GE(cases, 20);
}

}  // namespace
}  // namespace qmoe::test
