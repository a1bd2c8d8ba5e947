// qmoe verify — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_verify(CLI::App& app) {
  auto* sub = app.add_subcommand("verify", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'verify' is not implemented yet"); });
}

}  // namespace qmoe::cli
