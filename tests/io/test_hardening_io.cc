// Hostile safetensors files, checkpoint directories and output paths (issue #10, classes 2, 3, 5,
// 6, 7): every one is a clear qmoe::Error naming the file; outputs are never written through a
// planted link and never interleave.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "io_test_util.h"
#include "util/files.h"

namespace qmoe::test {
namespace {

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TEST(HardeningSafetensors, GapBeforeTheFirstTensorIsRejected) {
  const auto b = make_raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8);
  const std::string msg = error_of([&] { parse_bytes(b, "gap.safetensors"); });
  EXPECT_TRUE(has(msg, "gap.safetensors") && has(msg, "'a'") && has(msg, "no gaps")) << msg;
}

TEST(HardeningSafetensors, GapBetweenTensorsIsRejected) {
  const auto b = make_raw(
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})", 8);
  const std::string msg = error_of([&] { parse_bytes(b); });
  EXPECT_TRUE(has(msg, "'b'") && has(msg, "unused bytes [4, 6)")) << msg;
}

TEST(HardeningSafetensors, BytesAfterTheLastTensorAreRejected) {
  const auto b = make_raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9);
  const std::string msg = error_of([&] { parse_bytes(b, "tail.safetensors"); });
  EXPECT_TRUE(has(msg, "tail.safetensors") && has(msg, "5 bytes after the last tensor 'a'")) << msg;
  // No tensors at all but a data buffer: the same.
  EXPECT_TRUE(has(error_of([&] { parse_bytes(make_raw("{}", 3)); }), "3 bytes after the last tensor"));
  EXPECT_NO_THROW(parse_bytes(make_raw("{}", 0)));
}

TEST(HardeningSafetensors, DuplicatedTensorNameIsRejected) {
  const auto b = make_raw(
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8);
  const std::string msg = error_of([&] { parse_bytes(b); });
  EXPECT_TRUE(has(msg, "'a' appears more than once")) << msg;
}

// Found by fuzz_safetensors: nlohmann ends the input at a NUL byte, so "{}\0{...}" parsed as an
// empty header and the key scan then looked up keys that were not there (an uncaught exception).
TEST(HardeningSafetensors, NulByteInsideTheHeaderIsRejected) {
  const std::string h = std::string("{}\0", 3) + R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const std::string msg = error_of([&] { parse_bytes(make_raw(h, 1)); });
  EXPECT_TRUE(has(msg, "NUL byte at header offset 2")) << msg;
  for (const char* dir : {"safetensors", "run_input"}) {  // the fuzzers' inputs themselves
    const std::string f = std::string(QMOE_SOURCE_DIR "/tests/fuzz/corpus/") + dir + "/regress_nul_in_header.st";
    EXPECT_FALSE(error_of([&] { parse_bytes(read_bytes(f)); }).empty()) << f;
  }
  // NUL padding at the end of the header is tolerated.
  const std::string padded = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})" + std::string(3, '\0');
  EXPECT_EQ(parse_bytes(make_raw(padded, 1))->tensors().size(), 1u);
}

TEST(HardeningSafetensors, EmptyTensorsInsideTheLayoutAreAccepted) {
  const auto b = make_raw(
      R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("z":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      8);
  EXPECT_EQ(parse_bytes(b)->tensors().size(), 4u);
  // ...but not one pointing past the end.
  const auto c = make_raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0],)"
                          R"("data_offsets":[6,6]}})",
                          4);
  EXPECT_FALSE(error_of([&] { parse_bytes(c); }).empty());
}

// Class 2: 80k tensors took 2 minutes (quadratic); now linear-ish.
// O(N²) parsing (80k entries took 2 minutes once) shows as the time growing with the square of the
// tensor count. Compared as a ratio (8× the tensors: ~8× the time if linear, ~64× if quadratic),
// each the best of a few parses, so that a slow or loaded machine (ASan, CI) does not matter.
TEST(HardeningSafetensors, ManyTensorsParseInLinearTime) {
  auto best_parse_seconds = [](int n, int reps) {
    std::string h = "{";
    for (int i = 0; i < n; ++i)
      h += fmt::format("{}\"t{}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{},{}]}}", i ? "," : "", i, i, i + 1);
    h += "}";
    const auto b = make_raw(h, n);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto f = parse_bytes(b);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_EQ(f->tensors().size(), static_cast<size_t>(n));
    }
    return best;
  };
  const double small = best_parse_seconds(12500, 3);
  const double large = best_parse_seconds(100000, 2);
  EXPECT_LT(large, 24.0 * small) << "12.5k tensors: " << small << " s, 100k tensors: " << large << " s";
}

TEST(HardeningSafetensors, NonRegularFilesAreRejectedWithoutBlocking) {
  TempDir d;
  const std::string fifo = d.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = error_of([&] { SafetensorsFile::open(fifo); });  // used to block in open()
  EXPECT_TRUE(has(msg, fifo) && has(msg, "a FIFO") && has(msg, "regular file")) << msg;
  EXPECT_TRUE(has(error_of([&] { SafetensorsFile::read(fifo); }), "a FIFO"));
  EXPECT_TRUE(has(error_of([&] { SafetensorsFile::open("/dev/zero"); }), "character device"));
  EXPECT_TRUE(has(error_of([&] { SafetensorsFile::open(d.path().string()); }), "a directory"));
}

TEST(HardeningCheckpoint, ModelSafetensorsThatIsNotAFileIsNamed) {
  TempDir d;
  // A directory named model.safetensors was skipped, and reported later as a missing tensor.
  fs::create_directories(d.path() / "model.safetensors");
  std::string msg = error_of([&] { Checkpoint::open(d.path().string()); });
  EXPECT_TRUE(has(msg, "model.safetensors is a directory; expected a regular file")) << msg;
  fs::remove(d.path() / "model.safetensors");
  // A FIFO among the shards.
  write_safetensors(d.file("a.safetensors"), {{"x", Tensor::zeros(DType::F32, {2})}});
  ASSERT_EQ(::mkfifo(d.file("b.safetensors").c_str(), 0600), 0);
  msg = error_of([&] { Checkpoint::open(d.path().string()); });
  EXPECT_TRUE(has(msg, "b.safetensors is a FIFO")) << msg;
  fs::remove(d.path() / "b.safetensors");
  // The index as a directory.
  fs::create_directories(d.path() / "model.safetensors.index.json");
  msg = error_of([&] { Checkpoint::open(d.path().string()); });
  EXPECT_TRUE(has(msg, "model.safetensors.index.json is a directory")) << msg;
}

TEST(HardeningCheckpoint, DeepAndHugeIndexJsonIsAnError) {
  TempDir d;
  write_safetensors(d.file("s.safetensors"), {{"x", Tensor::zeros(DType::F32, {2})}});
  std::ofstream(d.file("model.safetensors.index.json"))
      << "{\"weight_map\": " << std::string(200000, '[') << std::string(200000, ']') << "}";
  const std::string msg = error_of([&] { Checkpoint::open(d.path().string()); });
  EXPECT_TRUE(has(msg, "model.safetensors.index.json") && has(msg, "nested deeper")) << msg;
}

TEST(HardeningCheckpoint, ReleasedPagesReadBackTheSameBytes) {
  TempDir d;
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  write_safetensors(d.file("model.safetensors"), {{"l.0.weight", Tensor::from_f32(v, {100000})},
                                                  {"l.1.weight", Tensor::from_f32(v, {1000, 100})}});
  const Checkpoint ck = Checkpoint::open(d.path().string());
  const Tensor a = ck.get("l.0.weight");
  ASSERT_EQ(a.data_as<float>()[99999], 99999.0f);
  ck.release_prefix("l.");
  EXPECT_EQ(a.data_as<float>()[12345], 12345.0f);
  EXPECT_EQ(ck.get("l.1.weight").data_as<float>()[54321], 54321.0f);
}

// ---- outputs (class 5) ----------------------------------------------------------------------

TEST(HardeningOutput, PlantedTmpSymlinkIsNotFollowed) {
  TempDir d;
  const std::string victim = d.file("victim.txt");
  std::ofstream(victim) << "precious";
  const std::string out = d.file("out.safetensors");
  fs::create_symlink(victim, out + ".tmp");  // the old fixed temporary name
  write_safetensors(out, {{"x", Tensor::zeros(DType::F32, {4})}});
  const std::vector<uint8_t> kept = read_bytes(victim);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "precious");
  EXPECT_EQ(SafetensorsFile::open(out)->tensors().size(), 1u);
}

TEST(HardeningOutput, SymlinkDestinationIsReplacedNotWrittenThrough) {
  TempDir d;
  const std::string victim = d.file("victim.txt");
  std::ofstream(victim) << "precious";
  const std::string out = d.file("out.safetensors");
  fs::create_symlink(victim, out);
  write_safetensors(out, {{"x", Tensor::zeros(DType::F32, {4})}});
  const std::vector<uint8_t> kept = read_bytes(victim);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "precious");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(SafetensorsFile::open(out)->tensors().size(), 1u);
}

TEST(HardeningOutput, ConcurrentWritersNeverInterleave) {
  TempDir d;
  const std::string out = d.file("same.safetensors");
  std::vector<std::thread> th;
  for (int w = 0; w < 4; ++w)
    th.emplace_back([&, w] {
      for (int i = 0; i < 10; ++i) {
        std::vector<float> v(static_cast<size_t>(50000 + 1000 * w), static_cast<float>(w));
        write_safetensors(out, {{"x", Tensor::from_f32(v, {static_cast<int64_t>(v.size())})}});
      }
    });
  for (auto& t : th) t.join();
  const auto f = SafetensorsFile::open(out);  // whole and valid: exactly one writer's file
  const Tensor x = f->get("x");
  const float w = x.data_as<float>()[0];
  EXPECT_EQ(x.numel(), 50000 + 1000 * static_cast<int64_t>(w));
  for (const auto& e : fs::directory_iterator(d.path())) EXPECT_EQ(e.path().filename(), "same.safetensors");
}

TEST(HardeningOutput, OutputPathIsCheckedUpFront) {
  TempDir d;
  EXPECT_TRUE(has(error_of([] { util::check_output_file("", "-o"); }), "-o: the output path is empty"));
  EXPECT_TRUE(has(error_of([&] { util::check_output_file(d.path().string(), "-o"); }), "is a directory"));
  EXPECT_TRUE(has(error_of([&] { util::check_output_file(d.file("no/such/x.st"), "-o"); }), "does not exist"));
  EXPECT_TRUE(has(error_of([&] { util::check_output_file(d.file("x/"), "-o"); }), "directory"));
  EXPECT_NO_THROW(util::check_output_file(d.file("fine.safetensors"), "-o"));
  // A device or FIFO is never replaced by the rename (as root, -o /dev/null would have been).
  ASSERT_EQ(::mkfifo(d.file("pipe").c_str(), 0600), 0);
  EXPECT_TRUE(has(error_of([&] { util::check_output_file(d.file("pipe"), "-o"); }), "is a FIFO"));
  EXPECT_TRUE(has(error_of([&] { write_safetensors(d.file("pipe"), {}); }), "is a FIFO"));
  EXPECT_TRUE(has(error_of([] { util::check_output_file("/dev/null", "-o"); }), "character device"));
  EXPECT_TRUE(has(error_of([] { write_safetensors("", {}); }), "empty name"));
}

}  // namespace
}  // namespace qmoe::test
