// commands.h — each subcommand of the `flashdllm` tool lives in its own cmd_*.cpp and
// registers itself on the top-level CLI11 app through one of these functions.
//
// A command parses into an options struct owned by its callback and throws (CliError or a
// library exception) on failure; main() turns every exception into one line on stderr and
// a non-zero exit status.
#pragma once

namespace CLI {
class App;
}

namespace fdl::cli {

void add_info_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_render_template_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
/// `profile`: the storage profile behind KV tier placement (src/kv/storage_profile.h).
void add_profile_command(CLI::App& app);
/// `tools` groups developer utilities: `tools make-model`, `tools check-invariance`.
void add_tools_command(CLI::App& app);
/// `tools check-invariance` (cmd_check_invariance.cpp), registered by add_tools_command.
void add_check_invariance_command(CLI::App& tools_app);
/// `tools json-schema-to-grammar` (cmd_json_schema_to_grammar.cpp), registered by add_tools_command.
void add_json_schema_to_grammar_command(CLI::App& tools_app);
void add_serve_command(CLI::App& app);
/// `multiturn`: a multi-turn chat workload for the KV tier benchmark (cmd_multiturn.cpp).
void add_multiturn_command(CLI::App& app);

}  // namespace fdl::cli
