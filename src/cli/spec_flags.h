// spec_flags.h — the --spec flag shared by generate, serve and bench: one list of the
// speculation modes, checked by CLI11 like --device (a value outside it is command-line
// syntax: exit status 2, one line naming the flag and the choices).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace fdl::cli {

/// Adds --spec (off | lookup | lookahead | auto, parsed later by parse_spec_mode) to `cmd`.
inline CLI::Option* add_spec_flag(CLI::App* cmd, std::string& spec, const std::string& help) {
  return cmd->add_option("--spec", spec, help)
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "lookup", "lookahead", "auto"}));
}

}  // namespace fdl::cli
