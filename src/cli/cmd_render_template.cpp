// `flashdllm render-template` — renders a Jinja chat template over a request read as JSON from
// stdin or --request ({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", ...}), with
// the interpreter the server uses, so a template can be checked offline. A template that
// fails to parse or raises (raise_exception) exits 1 with its message.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/model_path.h"
#include "jinja/template.h"
#include "server/ordered_json_parser.h"

namespace fdl::cli {
namespace {

struct RenderTemplateOptions {
  std::string template_file;
  std::string request_file;  // empty: stdin
};

void run_render_template(const RenderTemplateOptions& opt) {
  const std::string source = read_text_file("-t", opt.template_file);
  const std::string input = opt.request_file.empty()
                                ? std::string((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>())
                                : read_text_file("--request", opt.request_file);
  std::string error;
  const nlohmann::ordered_json request = server::parse_ordered_json(input, &error);
  if (request.is_discarded()) throw CliError("render-template: the request is not JSON: " + error);
  try {
    const jinja::Template t(source);
    const std::string text = t.render(jinja::chat_context(request));
    std::fwrite(text.data(), 1, text.size(), stdout);
  } catch (const jinja::TemplateError& e) {
    throw CliError(opt.template_file + ": " + e.what());
  }
}

}  // namespace

void add_render_template_command(CLI::App& app) {
  auto opt = std::make_shared<RenderTemplateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "render-template",
      "Render a Jinja chat template over a JSON request on stdin ({\"messages\", \"tools\", \"add_generation_prompt\", "
      "\"bos_token\", \"eos_token\"}) and print the text");
  cmd->add_option("-t,--template", opt->template_file, "Jinja chat template file")->required();
  cmd->add_option("--request", opt->request_file, "Read the request from this JSON file instead of stdin");
  cmd->callback([opt] { run_render_template(*opt); });
}

}  // namespace fdl::cli
