// model_path.h — which model file a command uses when -m is not given.
#pragma once

#include <filesystem>
#include <string>

namespace fdl::cli {

/// The model to open: `explicit_path` when non-empty, else $FLASHDLLM_MODEL, else
/// models/stories260K.gguf, else ../shared/models/stories260K.gguf (both relative to the
/// current directory). Throws CliError explaining how to get a model when none exists, or
/// when the chosen path is not a readable regular file.
std::filesystem::path resolve_model_path(const std::string& explicit_path);

}  // namespace fdl::cli

namespace fdl::cli {

/// The whole contents of the file a flag names (e.g. `-f prompt.txt`). Errors name the flag
/// and the path: "-f /tmp: is a directory", "-f x.txt: cannot open: No such file or directory".
std::string read_text_file(const char* flag, const std::string& path);

}  // namespace fdl::cli
