// qmoe quantize: an unquantized HF MoE checkpoint → the same model with Quark-quantized experts.
#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/quantizer.h"
#include "qmoe/schemes.h"

namespace qmoe::cli {

namespace {

// "5GB" (10^9), "500MB", "2GiB" (2^30), "123" (bytes).
uint64_t parse_size(const std::string& s) {
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) ++pos;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + pos, v);
  if (pos == 0 || ec != std::errc() || end != s.data() + pos || !std::isfinite(v))
    throw Error(fmt::format("--shard-size '{}': expected a size like 5GB, 500MB, 2GiB or a byte count", s));
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else throw Error(fmt::format("--shard-size '{}': unknown unit '{}' (B, KB, MB, GB, KiB, MiB, GiB)", s, unit));
  if (!(v * mult >= 1)) throw Error(fmt::format("--shard-size '{}' must be at least one byte", s));
  if (!(v * mult < 1.8e19)) throw Error(fmt::format("--shard-size '{}' is larger than 2^64 bytes", s));
  return static_cast<uint64_t>(v * mult);
}

}  // namespace

void register_quantize(CLI::App& app) {
  struct Args {
    std::string src, dst, scheme, calib, shard_size = "5GB";
    std::vector<std::string> exclude;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("quantize",
                                 "Quantize the MoE experts of an unquantized HF checkpoint as AMD Quark exports them");
  sub->add_option("src", args->src, "source checkpoint directory (config.json + BF16/F16/F32 safetensors)")
      ->required();
  sub->add_option("--scheme", args->scheme, "scheme name or alias (see `qmoe schemes`)")->required();
  sub->add_option("-o,--output", args->dst, "output directory")->required();
  sub->add_option("--calib", args->calib,
                  "calibration safetensors for static activation scales: 'hidden_states' [N, H] and/or "
                  "'model.layers.L.hidden_states'");
  sub->add_option("--exclude", args->exclude,
                  "leave matching layers unquantized (exact name, glob, or re:<regex>); repeatable");
  sub->add_option("--threads", args->threads, "worker threads (default: all cores)");
  sub->add_option("--shard-size", args->shard_size, "maximum shard size (default 5GB, like transformers)");
  sub->callback([args] {
    const SchemeInfo& scheme = scheme_by_name(args->scheme);
    for (size_t i = 0; i < args->exclude.size(); ++i)  // a bad pattern fails before any work
      (void)quark_pattern_matches(args->exclude[i], "");
    QuantizeOptions opt;
    opt.exclude = args->exclude;
    opt.calib_path = args->calib;
    opt.threads = bounded_threads(args->threads);
    opt.shard_size = parse_size(args->shard_size);
    if (args->dst.empty()) throw Error("-o/--output: the output directory is empty; expected a directory name");
    const QuantizeReport r = quantize_checkpoint(args->src, args->dst, scheme, opt);
    fmt::print("quantized {} expert linears with {} into {} ({} shard{}, {:.2f} MB of tensors; {} other tensors "
               "copied)\n",
               r.quantized_linears, scheme.name, args->dst, r.shards, r.shards == 1 ? "" : "s",
               static_cast<double>(r.total_bytes) / 1e6, r.copied_tensors);
    for (const auto& l : r.excluded_layers) fmt::print("left unquantized: {}\n", l);
  });
}

}  // namespace qmoe::cli
