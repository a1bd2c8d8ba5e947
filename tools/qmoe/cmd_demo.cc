// qmoe demo — placeholder until the command lands.
#include "commands.h"
#include "qmoe/error.h"

namespace qmoe::cli {

void register_demo(CLI::App& app) {
  auto* sub = app.add_subcommand("demo", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw qmoe::Error("'demo' is not implemented yet"); });
}

}  // namespace qmoe::cli
