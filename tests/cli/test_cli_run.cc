// `qmoe run`: the binary on conformance cases (output compared with `expected`), and its error exits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

std::string case_dir(const std::string& name) { return QMOE_SOURCE_DIR "/../shared/conformance/cases/" + name; }

struct Cmd {
  int rc = 0;
  std::string err;
};

class CliRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    tmp_ = fs::temp_directory_path() / ("qmoe_cli_run_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  std::string path(const std::string& f) const { return (tmp_ / f).string(); }

  // Runs `qmoe run ARGS`; stdout and stderr go to files in the temp dir.
  Cmd run(const std::string& args) const {
    const std::string cmd =
        std::string("\"") + QMOE_CLI_PATH + "\" run " + args + " >" + path("stdout.txt") + " 2>" + path("stderr.txt");
    const int status = std::system(cmd.c_str());
    Cmd c;
    c.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream f(path("stderr.txt"));
    std::stringstream ss;
    ss << f.rdbuf();
    c.err = ss.str();
    return c;
  }

  // Expects a failing run: non-zero exit, a message on stderr containing `keyword`, no output file.
  void expect_failure(const std::string& args, const std::string& keyword) const {
    const std::string out = path("out.safetensors");
    const Cmd c = run(args + " -o " + out);
    EXPECT_NE(c.rc, 0) << args;
    EXPECT_NE(c.err.find(keyword), std::string::npos) << "stderr: " << c.err;
    EXPECT_FALSE(fs::exists(out)) << "an output file was written on error";
  }

  fs::path tmp_;
};

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

double tolerance(const std::string& name) {
  std::ifstream f(case_dir(name) + "/case.json");
  return nlohmann::json::parse(f).at("tolerance_rel_l2_fp32").get<double>();
}

// The output file of a run against the case's `expected_name` and top-k.
void check_output(const std::string& out_path, const std::string& name, const std::string& expected_name) {
  const auto out = SafetensorsFile::open(out_path);
  const auto io = SafetensorsFile::open(case_dir(name) + "/io.safetensors");
  const Tensor o = out->get("output");
  EXPECT_EQ(o.dtype(), DType::F32);
  EXPECT_EQ(o.shape(), io->get("hidden_states").shape());
  const double err = rel_l2(to_f32(o), to_f32(io->get(expected_name)));
  EXPECT_LE(err, tolerance(name)) << name << " " << expected_name;
  const Tensor ids = out->get("topk_ids");
  EXPECT_EQ(ids.dtype(), DType::I32);
  EXPECT_EQ(to_f32(ids), to_f32(io->get("topk_ids")));
  const std::vector<float> w = to_f32(out->get("topk_weights")), want = to_f32(io->get("topk_weights"));
  ASSERT_EQ(w.size(), want.size());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], want[i], 1e-6 * std::fabs(want[i]));
}

TEST_F(CliRun, ReferenceKernelOnCasesWithRouterLogits) {
  for (const char* case_name : {"qwen3_w_mxfp4_a_mxfp4", "gpt_oss_w_mxfp4_bias", "deepseek_v3_w_mxfp4_a_mxfp4"}) {
    const std::string name = case_name;
    const std::string out = path(name + ".safetensors");
    const Cmd c = run(case_dir(name) + " --layer 0 --input " + case_dir(name) + "/io.safetensors -o " + out +
                      " --kernel reference");
    ASSERT_EQ(c.rc, 0) << c.err;
    check_output(out, name, "expected");
  }
}

TEST_F(CliRun, DefaultKernelComputesRouterLogits) {
  // Input with hidden_states only: logits come from the router weight; default layer and kernel.
  const std::string name = "qwen3_int8_wchannel_adyntoken";
  const auto io = SafetensorsFile::open(case_dir(name) + "/io.safetensors");
  write_safetensors(path("in.safetensors"), {{"hidden_states", io->get("hidden_states")}});
  const Cmd c =
      run(case_dir(name) + " --input " + path("in.safetensors") + " -o " + path("out.safetensors") + " --threads 2");
  ASSERT_EQ(c.rc, 0) << c.err;
  check_output(path("out.safetensors"), name, "expected");
}

TEST_F(CliRun, TensorAndExpertParallelRanks) {
  const std::string name = "qwen3_w_mxfp4_a_mxfp4";
  const std::string in = case_dir(name) + "/io.safetensors";
  ASSERT_EQ(run(case_dir(name) + " --layer 0 -i " + in + " -o " + path("tp.safetensors") +
                " --kernel reference --tp-rank 1 --tp-size 2")
                .rc,
            0);
  check_output(path("tp.safetensors"), name, "expected_tp2_rank1");
  ASSERT_EQ(run(case_dir(name) + " --layer 0 -i " + in + " -o " + path("ep.safetensors") +
                " --kernel reference --ep-rank 0 --ep-size 2")
                .rc,
            0);
  check_output(path("ep.safetensors"), name, "expected_ep2_rank0");
}

TEST_F(CliRun, AllRanksOfALayoutInOneProcess) {
  // --ep / --tp run every rank here and write the whole layer's output: the case's expected output.
  const std::string name = "mixtral_int8_wtensor_astatic";  // static scales: gathered over the EP ranks
  const std::string in = case_dir(name) + "/io.safetensors";
  for (const char* layout : {"--ep 2", "--ep 3 --dispatch all-gather", "--ep 2 --tp 2", "--tp 2"}) {
    const std::string out = path("all.safetensors");
    const Cmd c = run(case_dir(name) + " --layer 0 -i " + in + " -o " + out + " --kernel reference " + layout);
    ASSERT_EQ(c.rc, 0) << layout << ": " << c.err;
    check_output(out, name, "expected");
  }
  expect_failure(case_dir(name) + " -i " + in + " --ep 2 --ep-size 2", "exclude each other");
  expect_failure(case_dir(name) + " -i " + in + " --ep 99", "larger than the layer's");
  expect_failure(case_dir(name) + " -i " + in + " --ep 0", "at least 1");
  expect_failure(case_dir(name) + " -i " + in + " --devices cuda:0", "--device cuda");
  expect_failure(case_dir(name) + " -i " + in + " --ep 2 --dispatch broadcast", "dispatch");
}

TEST_F(CliRun, InputErrors) {
  const std::string model = case_dir("qwen3_w_mxfp4");
  const auto io = SafetensorsFile::open(model + "/io.safetensors");
  const Tensor hs = io->get("hidden_states");
  const int64_t T = hs.dim(0), H = hs.dim(1);

  write_safetensors(path("no_hidden.safetensors"), {{"router_logits", io->get("router_logits")}});
  expect_failure(model + " --layer 0 -i " + path("no_hidden.safetensors"), "hidden_states");

  write_safetensors(path("i32.safetensors"), {{"hidden_states", Tensor::zeros(DType::I32, {T, H})}});
  expect_failure(model + " --layer 0 -i " + path("i32.safetensors"), "dtype");

  write_safetensors(path("1d.safetensors"), {{"hidden_states", Tensor::zeros(DType::F32, {H})}});
  expect_failure(model + " --layer 0 -i " + path("1d.safetensors"), "shape");

  write_safetensors(path("t0.safetensors"), {{"hidden_states", Tensor::zeros(DType::BF16, {0, H})}});
  expect_failure(model + " --layer 0 -i " + path("t0.safetensors"), "no tokens");

  write_safetensors(path("wrong_h.safetensors"), {{"hidden_states", Tensor::zeros(DType::F32, {T, H / 2})}});
  expect_failure(model + " --layer 0 -i " + path("wrong_h.safetensors"), "hidden size");

  write_safetensors(path("bad_logits.safetensors"),
                    {{"hidden_states", hs}, {"router_logits", Tensor::zeros(DType::F32, {T, 3})}});
  expect_failure(model + " --layer 0 -i " + path("bad_logits.safetensors"), "router_logits");

  std::vector<float> logits = to_f32(io->get("router_logits"));
  logits[static_cast<size_t>(io->get("router_logits").dim(1)) * 2 + 1] = NAN;  // token 2
  write_safetensors(
      path("nan.safetensors"),
      {{"hidden_states", hs}, {"router_logits", Tensor::from_f32(logits, io->get("router_logits").shape())}});
  expect_failure(model + " --layer 0 -i " + path("nan.safetensors"), "token 2");

  expect_failure(model + " --layer 0 -i " + path("missing.safetensors"), "missing.safetensors");
}

TEST_F(CliRun, OptionAndModelErrors) {
  const std::string model = case_dir("qwen3_w_mxfp4");
  const std::string in = model + "/io.safetensors";
  expect_failure(model + " --layer 0 -i " + in + " --tp-rank 2 --tp-size 2", "tp-rank");
  expect_failure(model + " --layer 0 -i " + in + " --ep-size 0", "ep-size");
#ifndef QMOE_HAVE_CUDA
  expect_failure(model + " --layer 0 -i " + in + " --device cuda", "CUDA");
#endif
  expect_failure(model + " --layer 5 -i " + in, "layer 5");
  expect_failure(case_dir("no_such_case") + " --layer 0 -i " + in, "config.json");
  expect_failure(case_dir("err_missing_expert_tensor") + " --layer 0 -i " + in, "experts.5.up_proj");
}

}  // namespace
}  // namespace qmoe
