#include "cli/model_path.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "cli/cli_error.h"

namespace fdl::cli {
namespace {

namespace fs = std::filesystem;

// Fail early with a message naming the path: the GGUF reader would also reject a missing
// file, but "no such file" with the source of the path (flag or environment) is clearer.
fs::path checked(const fs::path& p, const char* source) {
  std::error_code ec;
  const auto status = fs::status(p, ec);
  if (ec || !fs::exists(status)) {
    throw CliError("model file '" + p.string() + "' (" + source + ") does not exist");
  }
  if (fs::is_directory(status)) {
    // A Hugging Face model directory (src/hf reads it); anything else is named here.
    if (!fs::exists(fs::symlink_status(p / "config.json", ec)))
      throw CliError("model path '" + p.string() + "' (" + source +
                     ") is a directory without a config.json (expected a GGUF file or a Hugging Face model directory)");
    return p;
  }
  if (!fs::is_regular_file(status)) {
    throw CliError("model path '" + p.string() + "' (" + source + ") is not a regular file or directory");
  }
  return p;
}

}  // namespace

fs::path resolve_model_path(const std::string& explicit_path) {
  if (!explicit_path.empty()) return checked(explicit_path, "from -m");
  if (const char* env = std::getenv("FLASHDLLM_MODEL"); env != nullptr && *env != '\0') {
    return checked(env, "from $FLASHDLLM_MODEL");
  }
  for (const fs::path& candidate :
       {fs::path("models/stories260K.gguf"), fs::path("../shared/models/stories260K.gguf")}) {
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  throw CliError(
      "no model given: pass -m FILE.gguf (or a Hugging Face model directory) or set FLASHDLLM_MODEL (for a quick test, download "
      "stories260K.gguf from huggingface.co/ggml-org/models (tinyllamas) into models/, or "
      "create one with `flashdllm tools make-model --preset tiny -o models/tiny.gguf`)");
}

}  // namespace fdl::cli

namespace fdl::cli {

std::string read_text_file(const char* flag, const std::string& path) {
  const std::string where = std::string(flag) + " " + path + ": ";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw CliError(where + "is a directory");
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw CliError(where + "cannot open: " + std::strerror(errno ? errno : EIO));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int err = std::ferror(f) ? (errno ? errno : EIO) : 0;
  std::fclose(f);
  if (err != 0) throw CliError(where + "read failed: " + std::strerror(err));
  return out;
}

}  // namespace fdl::cli
