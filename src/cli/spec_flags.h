// spec_flags.h — the --spec and --spec-tree flags shared by generate, serve and bench: one
// list of the choices each, checked by CLI11 like --device (a value outside it is
// command-line syntax: exit status 2, one line naming the flag and the choices).
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

/// Adds --spec-tree on|off (SpecOptions::tree: verify several candidate drafts per sequence
/// as a token tree where the model supports it; default off). Checked like --spec.
inline CLI::Option* add_spec_tree_flag(CLI::App* cmd, std::string& tree) {
  return cmd->add_option("--spec-tree", tree,
                         "Verify several candidate drafts per step as a token tree (CPU and CUDA models): on or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
}

}  // namespace fdl::cli
