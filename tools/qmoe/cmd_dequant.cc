// qmoe dequant — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_dequant(CLI::App& app) {
  auto* sub = app.add_subcommand("dequant", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'dequant' is not implemented yet"); });
}

}  // namespace qmoe::cli
