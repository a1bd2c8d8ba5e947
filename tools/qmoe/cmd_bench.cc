// qmoe bench — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'bench' is not implemented yet"); });
}

}  // namespace qmoe::cli
