// `flashdllm tokenize` — text to token ids with the model's own tokenizer (matches
// llama.cpp's llama-tokenize). Loads only the GGUF metadata, not the weights.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/model_path.h"
#include "cli/text_escape.h"
#include "flashdllm/gguf.h"
#include "flashdllm/model.h"
#include "flashdllm/tokenizer.h"

namespace fdl::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;  // alternative to --text: exact bytes, NUL and all
  bool no_bos = false;
  bool parse_special = false;
  bool json = false;
};

void run_tokenize(const TokenizeOptions& opt) {
  const std::string text = opt.file.empty() ? opt.text : read_text_file("-f", opt.file);
  const GgufFile gguf = Model::open_file(resolve_model_path(opt.model));
  const auto tokenizer = Tokenizer::from_gguf(gguf);
  const std::vector<int32_t> ids = tokenizer->encode(text, !opt.no_bos, opt.parse_special);

  if (opt.json) {
    print_json_line(nlohmann::json{{"ids", ids}});
    return;
  }
  for (const int32_t id : ids) {
    // render_special so that <s> shows as itself rather than as nothing
    const std::string piece = tokenizer->token_to_piece(id, /*render_special=*/true);
    std::printf("%6d -> '%s'\n", id, escape_piece(piece).c_str());
  }
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("-m,--model", opt->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  auto* text = cmd->add_option("--text,-p,--prompt", opt->text, "Text to tokenize");
  auto* file = cmd->add_option("-f,--file", opt->file, "Tokenize the bytes of this file instead");
  text->excludes(file);
  cmd->add_flag("--no-bos", opt->no_bos, "Do not add BOS/EOS even if the model asks for them");
  cmd->add_flag("--parse-special", opt->parse_special,
                "Turn text such as <s> into the special token it names");
  cmd->add_flag("--json", opt->json, "Print {\"ids\":[...]} instead of one line per token");
  cmd->callback([opt, text, file] {
    // `--text ""` is a valid (empty) input, so presence is judged by count, not content.
    if (text->count() == 0 && file->count() == 0) {
      throw CliError("tokenize needs --text TEXT or --file FILE");
    }
    run_tokenize(*opt);
  });
}

}  // namespace fdl::cli
