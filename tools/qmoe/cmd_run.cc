// qmoe run — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'run' is not implemented yet"); });
}

}  // namespace qmoe::cli
