// `flashdllm tools json-schema-to-grammar [FILE]` — prints the GBNF grammar a JSON schema
// becomes (the one `--json-schema` and the server's `response_format` enforce), read from
// FILE or stdin, so a schema can be checked, or the grammar edited and given to `--grammar`.
// An invalid or unsupported schema exits 1 with its JSON pointer and reason.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/model_path.h"
#include "cli/stdout_io.h"
#include "flashdllm/grammar.h"
#include "grammar/json_schema.h"
#include "server/ordered_json_parser.h"

namespace fdl::cli {
namespace {

void run_json_schema_to_grammar(const std::string& file) {
  const std::string text = file.empty() ? std::string((std::istreambuf_iterator<char>(std::cin)),
                                                      std::istreambuf_iterator<char>())
                                        : read_text_file("FILE", file);
  std::string error;
  const nlohmann::ordered_json schema = server::parse_ordered_json(text, &error);  // properties keep the schema's order
  if (schema.is_discarded()) throw CliError("the schema is not JSON: " + error);
  try {
    const std::string gbnf = grammar::json_schema_to_gbnf(schema);
    (void)Grammar::compile(gbnf);  // what the engine would refuse is refused here too
    write_stdout(gbnf);
    if (!gbnf.empty() && gbnf.back() != '\n') write_stdout("\n");
    flush_stdout();
  } catch (const GrammarError& e) {
    throw CliError(std::string("invalid JSON schema: ") + e.what());
  }
}

}  // namespace

void add_json_schema_to_grammar_command(CLI::App& tools_app) {
  auto file = std::make_shared<std::string>();
  CLI::App* cmd = tools_app.add_subcommand("json-schema-to-grammar",
                                           "Print the GBNF grammar a JSON schema is enforced with (docs/GRAMMARS.md)");
  cmd->add_option("FILE", *file, "JSON schema file (default: stdin)");
  cmd->callback([file] { run_json_schema_to_grammar(*file); });
}

}  // namespace fdl::cli
