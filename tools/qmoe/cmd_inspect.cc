// qmoe inspect — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_inspect(CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'inspect' is not implemented yet"); });
}

}  // namespace qmoe::cli
