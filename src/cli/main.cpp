// flashdllm — command-line front end: generate, bench, tokenize, info, tools make-model.
//
// Every failure ends here: the message is flattened to one line on stderr and the process
// exits with status 1 (2 for command-line syntax errors), never with an abort or a trace.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.h"
#include "cli/stdout_io.h"

namespace {

// Library messages may span lines (e.g. a nested cause); the contract is one line.
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

void print_error(const std::string& message) {
  std::fprintf(stderr, "flashdllm: error: %s\n", one_line(message).c_str());
}

// CLI11 reports a mistyped command as "A subcommand is required"; name the word instead.
// Walks the leading non-option words down the command tree (`tools make-model`).
void check_command_words(const CLI::App& app, int argc, char** argv) {
  const CLI::App* level = &app;
  for (int i = 1;; ++i) {
    const auto subs = level->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return;  // a command with its own arguments from here on
    std::string names;
    for (const CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
    if (i == argc) {
      throw CLI::RequiredError(
          "a command is required: one of " + names, CLI::ExitCodes::RequiredError);
    }
    if (argv[i][0] == '-') return;  // --help, --version, or an option CLI11 will judge
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : subs) {
      if (sub->check_name(argv[i])) next = sub;
    }
    if (next == nullptr) {
      throw CLI::ExtrasError("unknown command '" + std::string(argv[i]) + "' (expected one of: " +
                             names + ")", CLI::ExitCodes::ExtrasError);
    }
    level = next;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashdllm — LLM inference engine (Llama-family GGUF models on CPUs and NVIDIA GPUs)",
               "flashdllm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashdllm 0.1.0");
  fdl::cli::add_generate_command(app);
  fdl::cli::add_bench_command(app);
  fdl::cli::add_profile_command(app);
  fdl::cli::add_tokenize_command(app);
  fdl::cli::add_render_template_command(app);
  fdl::cli::add_info_command(app);
  fdl::cli::add_tools_command(app);
  fdl::cli::add_serve_command(app);
  fdl::cli::add_multiturn_command(app);

  try {
    check_command_words(app, argc, argv);
    app.parse(argc, argv);  // the chosen subcommand runs in its callback, inside parse()
    // Buffered output may still be pending: a write error (e.g. ENOSPC) surfaces only now.
    fdl::cli::flush_stdout();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(std::string(e.what()) + " (run `flashdllm --help` for usage)");
    return 2;
  } catch (const std::bad_alloc&) {
    print_error("out of memory (a KV pool or tier larger than this machine's memory? "
                "lower --kv-tier0-bytes, --kv-host-bytes or -c)");
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  } catch (...) {
    print_error("unknown failure");
    return 1;
  }
  return 0;
}
