// The CLI against hostile options and files (issue #10, classes 3, 5, 6, 7): option errors come
// before any work, outputs are never written through a planted link, a failed quantize leaves the
// old checkpoint as it was, and every message names what is wrong.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

const std::string kCases = QMOE_SOURCE_DIR "/../shared/conformance/cases";
const std::string kRunCase = kCases + "/qwen3_w_mxfp4_a_mxfp4";

struct Cmd {
  int rc = 0;
  std::string out, err;
  double seconds = 0;
};

class CliHardening : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    tmp_ = fs::temp_directory_path() / ("qmoe_cli_hard_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }
  std::string path(const std::string& f) const { return (tmp_ / f).string(); }

  Cmd qmoe(const std::string& args) const {
    const std::string cmd = std::string("\"") + QMOE_CLI_PATH + "\" " + args + " >" + path("stdout.txt") + " 2>" +
                            path("stderr.txt");
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    Cmd c;
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    auto slurp = [](const std::string& p) {
      std::ifstream f(p);
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    };
    c.out = slurp(path("stdout.txt"));
    c.err = slurp(path("stderr.txt"));
    return c;
  }
  std::string run_args(const std::string& extra) const {
    return "run " + kRunCase + " -i " + kRunCase + "/io.safetensors " + extra;
  }

  fs::path tmp_;
};

::testing::AssertionResult fails_with(const Cmd& c, const std::string& what) {
  if (c.rc != 1) return ::testing::AssertionFailure() << "rc " << c.rc << ", stderr: " << c.err;
  if (c.err.find("qmoe: error: ") == std::string::npos) return ::testing::AssertionFailure() << "stderr: " << c.err;
  if (c.err.find(what) == std::string::npos)
    return ::testing::AssertionFailure() << "'" << what << "' not in stderr: " << c.err;
  return ::testing::AssertionSuccess();
}

TEST_F(CliHardening, NegativeLayerIsAnError) {
  EXPECT_TRUE(fails_with(qmoe(run_args("--layer -5 -o " + path("o.st"))), "--layer -5"));
  EXPECT_FALSE(fs::exists(path("o.st")));
  EXPECT_TRUE(fails_with(qmoe("dequant " + kRunCase + " --layer -1 --expert 0 -o " + path("d.st")), "--layer -1"));
}

TEST_F(CliHardening, BadOutputPathFailsBeforeAnyWork) {
  EXPECT_TRUE(fails_with(qmoe(run_args("-o \"\"")), "output path is empty"));
  EXPECT_TRUE(fails_with(qmoe(run_args("-o " + tmp_.string())), "is a directory"));
  EXPECT_TRUE(fails_with(qmoe(run_args("-o " + path("missing/dir/o.st"))), "does not exist"));
  // Before the input is even read: a broken input is not reported first.
  EXPECT_TRUE(fails_with(qmoe("run " + kRunCase + " -i /nonexistent.st -o \"\""), "output path is empty"));
  EXPECT_TRUE(fails_with(qmoe("dequant " + kRunCase + " --layer 0 --expert 0 -o \"\""), "output path is empty"));
  EXPECT_TRUE(fails_with(qmoe("quantize " + kCases + "/edge_topk_all_qwen3_nvfp4/source --scheme nvfp4 -o \"\""),
                         "output directory is empty"));
}

TEST_F(CliHardening, HugeThreadCountIsBoundedByTheHardware) {
  const Cmd c = qmoe(run_args("--threads 2147483647 -o " + path("o.st")));
  EXPECT_EQ(c.rc, 0) << c.err;
  EXPECT_NE(c.err.find("exceeds the"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("hardware threads"), std::string::npos) << c.err;
  EXPECT_TRUE(fails_with(qmoe(run_args("--threads -3 -o " + path("o.st"))), "--threads must be >= 0"));
}

TEST_F(CliHardening, PlantedSymlinksAreNeverWrittenThrough) {
  const std::string victim = path("victim.txt");
  std::ofstream(victim) << "precious";
  const std::string out = path("out.safetensors");
  fs::create_symlink(victim, out + ".tmp");
  ASSERT_EQ(qmoe(run_args("-o " + out)).rc, 0);
  fs::remove(out);
  fs::create_symlink(victim, out);
  ASSERT_EQ(qmoe(run_args("-o " + out)).rc, 0);
  std::ifstream f(victim);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "precious");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_NO_THROW(SafetensorsFile::open(out)->get("output"));
}

TEST_F(CliHardening, NonFiniteHiddenStatesNameTheToken) {
  const auto io = SafetensorsFile::open(kRunCase + "/io.safetensors");
  std::vector<float> x = to_f32(io->get("hidden_states"));
  const int64_t T = io->get("hidden_states").dim(0), H = io->get("hidden_states").dim(1);
  x[static_cast<size_t>(2 * H + 5)] = NAN;
  for (bool with_logits : {true, false}) {
    std::vector<NamedTensor> t = {{"hidden_states", Tensor::from_f32(x, {T, H})}};
    if (with_logits) t.push_back({"router_logits", io->get("router_logits")});
    write_safetensors(path("in.st"), t);
    const Cmd c = qmoe("run " + kRunCase + " -i " + path("in.st") + " -o " + path("o.st"));
    EXPECT_TRUE(fails_with(c, "'hidden_states' holds nan at token 2 (column 5)")) << with_logits;
    EXPECT_EQ(c.err.find("router logits"), std::string::npos) << c.err;
    EXPECT_FALSE(fs::exists(path("o.st")));
  }
}

TEST_F(CliHardening, ModelSafetensorsDirectoryIsNamed) {
  const fs::path m = tmp_ / "model";
  fs::create_directories(m / "model.safetensors");
  fs::copy_file(kRunCase + "/config.json", m / "config.json");
  const Cmd c = qmoe("run " + m.string() + " -i " + kRunCase + "/io.safetensors -o " + path("o.st"));
  EXPECT_TRUE(fails_with(c, "model.safetensors is a directory; expected a regular file"));
  EXPECT_EQ(c.err.find("not found"), std::string::npos) << c.err;
  // config.json as a FIFO: no hang.
  fs::remove(m / "config.json");
  ASSERT_EQ(::mkfifo((m / "config.json").c_str(), 0600), 0);
  const Cmd f = qmoe("inspect " + m.string());
  EXPECT_TRUE(fails_with(f, "is a FIFO"));
  EXPECT_LT(f.seconds, 30.0);
}

TEST_F(CliHardening, FailedQuantizeLeavesThePreviousCheckpoint) {
  const std::string src_case = kCases + "/edge_topk_all_qwen3_nvfp4/source";
  const std::string dst = path("dst");
  ASSERT_EQ(qmoe("quantize " + src_case + " --scheme w_mxfp4 -o " + dst).rc, 0);
  const auto before = SafetensorsFile::open(dst + "/model.safetensors")->tensors().size();
  // A source with a NaN weight fails while quantizing.
  const fs::path bad = tmp_ / "bad_src";
  fs::create_directories(bad);
  fs::copy_file(src_case + "/config.json", bad / "config.json");
  const auto sf = SafetensorsFile::open(src_case + "/model.safetensors");
  std::vector<NamedTensor> tensors;
  for (const auto& ti : sf->tensors()) {
    Tensor t = sf->get(ti.name).clone();
    if (ti.name.find("experts.1.down_proj.weight") != std::string::npos) {
      std::vector<float> v = to_f32(t);
      v[7] = NAN;
      t = Tensor::from_f32(v, t.shape());
    }
    tensors.push_back({ti.name, t});
  }
  write_safetensors((bad / "model.safetensors").string(), tensors);
  const Cmd c = qmoe("quantize " + bad.string() + " --scheme w_mxfp4 -o " + dst);
  EXPECT_TRUE(fails_with(c, "must be finite")) << c.err;
  ASSERT_TRUE(fs::exists(dst + "/model.safetensors"));
  EXPECT_EQ(SafetensorsFile::open(dst + "/model.safetensors")->tensors().size(), before);
  for (const auto& e : fs::directory_iterator(tmp_))  // no temporary directory is left behind
    EXPECT_EQ(e.path().filename().string().find(".dst."), std::string::npos) << e.path();
  // A directory with files quantize does not write is not replaced.
  std::ofstream(dst + "/notes.txt") << "mine";
  EXPECT_TRUE(fails_with(qmoe("quantize " + src_case + " --scheme w_mxfp4 -o " + dst), "'notes.txt'"));
  EXPECT_TRUE(fs::exists(dst + "/notes.txt"));
}

TEST_F(CliHardening, LibraryExceptionTextNeverLeaks) {
  const std::string src_case = kCases + "/edge_topk_all_qwen3_nvfp4/source";
  for (const char* size : {"1e999", ".", "5..5GB", "99999999999999999999999GB"}) {
    const Cmd c = qmoe("quantize " + src_case + " --scheme nvfp4 --shard-size " + size + " -o " + path("q"));
    EXPECT_TRUE(fails_with(c, "--shard-size")) << size;
    EXPECT_EQ(c.err.find("stod"), std::string::npos) << c.err;
  }
  const fs::path m = tmp_ / "m";
  fs::create_directories(m);
  std::ofstream(m / "config.json") << R"({"model_type": "qwen3_moe", "hidden_size": 1e400})";
  const Cmd c = qmoe("inspect " + m.string());
  EXPECT_TRUE(fails_with(c, "number overflow"));
  EXPECT_EQ(c.err.find("json.exception"), std::string::npos) << c.err;
}

}  // namespace
}  // namespace qmoe
