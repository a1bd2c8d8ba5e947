// qmoe command-line interface. Errors print "qmoe: error: ..." on stderr and exit 1.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>
#include <system_error>

#include "commands.h"
#include "qmoe/error.h"
#include "qmoe/schemes.h"

namespace qmoe::cli {

void register_schemes(CLI::App& app) {
  auto* sub = app.add_subcommand("schemes", "List the supported quantization schemes");
  sub->callback([] {
    fmt::print("{:<34} {:<22} {:<12} {:<14} {:<16} {:>5}\n", "scheme", "method", "weights", "weight scale",
               "activations", "bits");
    for (const auto& s : all_schemes())
      fmt::print("{:<34} {:<22} {:<12} {:<14} {:<16} {:>5.2f}\n", s.name, to_string(s.method), to_string(s.weight),
                 to_string(s.weight_scale), to_string(s.act), s.bits_per_weight);
  });
}

}  // namespace qmoe::cli

int main(int argc, char** argv) {
  CLI::App app{"qmoe: Quark-quantized Mixture-of-Experts layers on CPU and CUDA"};
  app.require_subcommand(1);
  qmoe::cli::register_inspect(app);
  qmoe::cli::register_dequant(app);
  qmoe::cli::register_run(app);
  qmoe::cli::register_bench(app);
  qmoe::cli::register_quantize(app);
  qmoe::cli::register_demo(app);
  qmoe::cli::register_verify(app);
  qmoe::cli::register_schemes(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qmoe::Error& e) {
    std::fprintf(stderr, "qmoe: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "qmoe: error: out of memory (an allocation failed; the input or model is larger than this "
                         "machine can hold)\n");
    return 1;
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "qmoe: error: the system refused a resource: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qmoe: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
