// `qmoe bench --device cpu`: sized from the machine (LLC from sysfs, weight copies over ≥ 4 × LLC
// unless --max-weight-gb caps them, which it says), JSON fields, and the > 100 % flag field.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cpu/membw.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

struct Out {
  int rc = -1;
  std::string out, err;
};

Out run_bench(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("qmoe_cli_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cmd = std::string("\"") + QMOE_CLI_PATH + "\" bench " + args + " >" + (dir / "o.txt").string() +
                          " 2>" + (dir / "e.txt").string();
  const int status = std::system(cmd.c_str());
  Out r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(dir / "o.txt");
  r.err = slurp(dir / "e.txt");
  fs::remove_all(dir);
  return r;
}

TEST(CliBench, LastLevelCacheFromSysfs) {
  const cpu::CacheInfo c = cpu::last_level_cache();
  EXPECT_GT(c.llc_bytes, 0);
  if (fs::exists("/sys/devices/system/cpu/cpu0/cache/index0/level")) {
    EXPECT_TRUE(c.from_sysfs);
    EXPECT_GE(c.level, 2);
    EXPECT_GE(c.instances, 1);
  }
}

TEST(CliBench, JsonCarriesLlcWorkingSetAndFlag) {
  // 0.02 GB caps the weight copies of the tiny shape below 4 × LLC on any machine with ≥ 5 MB LLC:
  // the command must say so.
  const Out r = run_bench("--device cpu --shape tiny --scheme w_mxfp4_a_mxfp4 --tokens 1,3 --reps 1 --threads 1 "
                          "--max-weight-gb 0.02 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  const cpu::CacheInfo c = cpu::last_level_cache();
  for (const auto& p : j) {
    EXPECT_EQ(p.at("llc_bytes").get<int64_t>(), c.llc_bytes);
    EXPECT_GE(p.at("weight_copies").get<int>(), 1);
    EXPECT_GT(p.at("working_set_bytes").get<double>(), 0.0);
    EXPECT_LE(p.at("working_set_bytes").get<double>(), 0.02e9 + 1.0);
    EXPECT_EQ(p.at("above_bandwidth").get<bool>(), p.at("pct_of_bandwidth").get<double>() > 100.0);
    EXPECT_GT(p.at("bandwidth_gbps").get<double>(), 0.0);
  }
  if (c.llc_bytes >= (int64_t{5} << 20)) {
    EXPECT_NE(r.err.find("working set below 4 × LLC"), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("LLC"), std::string::npos);
}

}  // namespace
}  // namespace qmoe
