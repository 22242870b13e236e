// stdout_io.h — writes to stdout that notice failure (ENOSPC on /dev/full, EPIPE on a closed
// pipe when SIGPIPE is ignored) and throw StdoutError, so a command stops at once and main()
// reports "writing to stdout: <reason>" with exit status 1 instead of exiting 0.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "cli/cli_error.h"

namespace fdl::cli {

class StdoutError : public CliError {
 public:
  explicit StdoutError(int err)
      : CliError(std::string("writing to stdout: ") + std::strerror(err != 0 ? err : EIO)) {}
};

/// Flush stdout; throws StdoutError when this or an earlier buffered write failed.
inline void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) throw StdoutError(errno);
}

/// Write `s` to stdout (buffered); throws StdoutError on failure.
inline void write_stdout(std::string_view s) {
  errno = 0;
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw StdoutError(errno);
  if (std::ferror(stdout)) throw StdoutError(errno);
}

}  // namespace fdl::cli
