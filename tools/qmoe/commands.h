// The qmoe CLI: one file per command, each registering a CLI11 subcommand.
#pragma once

#include <CLI/CLI.hpp>

namespace qmoe::cli {

void register_inspect(CLI::App& app);   // cmd_inspect.cc
void register_dequant(CLI::App& app);   // cmd_dequant.cc
void register_run(CLI::App& app);       // cmd_run.cc
void register_bench(CLI::App& app);     // cmd_bench.cc
void register_quantize(CLI::App& app);  // cmd_quantize.cc
void register_demo(CLI::App& app);      // cmd_demo.cc
void register_verify(CLI::App& app);    // cmd_verify.cc
void register_schemes(CLI::App& app);   // main.cc

}  // namespace qmoe::cli
