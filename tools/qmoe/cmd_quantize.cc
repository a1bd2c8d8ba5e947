// qmoe quantize — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_quantize(CLI::App& app) {
  auto* sub = app.add_subcommand("quantize", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'quantize' is not implemented yet"); });
}

}  // namespace qmoe::cli
