// Failed writes to stdout must fail the command: with stdout on /dev/full (ENOSPC) or on a
// pipe whose reader has gone (EPIPE, SIGPIPE ignored as many parents leave it), every
// command exits 1 with "flashdllm: error: writing to stdout: <reason>", and generate stops
// at once instead of generating the rest of its tokens into the void.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

struct Outcome {
  int exit_code = -1;  // 128 + signal when killed
  std::string err;
};

/// Run the CLI with `stdout_fd` as its stdout (stderr captured in a scratch file). With
/// `ignore_sigpipe`, the child starts with SIGPIPE ignored, so a closed pipe gives EPIPE.
Outcome run_with_stdout(const std::vector<std::string>& args, int stdout_fd, bool ignore_sigpipe,
                        const std::string& tag) {
  const auto err_path = scratch_dir() / ("stdout-errors-" + tag + ".err");
  const std::string bin = cli_binary().string();
  std::vector<std::string> argv_s = {bin};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in_fd = ::open("/dev/null", O_RDONLY);
    if (err_fd < 0 || in_fd < 0) ::_exit(120);
    ::dup2(in_fd, 0);
    ::dup2(stdout_fd, 1);
    ::dup2(err_fd, 2);
    ::signal(SIGPIPE, ignore_sigpipe ? SIG_IGN : SIG_DFL);
    ::execv(bin.c_str(), argv.data());
    ::_exit(121);
  }
  Outcome o;
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::ifstream in(err_path);
  o.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return o;
}

std::filesystem::path stories() { return model_path("stories260K.gguf"); }

bool is_char_device(const char* path) {
  struct stat st{};
  return ::stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

TEST(CliStdoutErrors, FullDeviceFailsEveryCommand) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  if (!is_char_device("/dev/full")) GTEST_SKIP() << "/dev/full is not available";
  const std::string m = stories().string();
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "-m", m, "-p", "Once", "-n", "8", "-s", "1"},
      {"generate", "-m", m, "-p", "Once", "-n", "8", "-s", "1", "--json"},
      {"tokenize", "-m", m, "--text", "hello"},
      {"info", "-m", m, "--json"},
      {"info", "-m", m},
      {"bench", "-m", m, "-p", "4", "-n", "2", "-r", "1"},
      {"tools", "check-invariance", "-m", m, "--prompts", "2", "--min-len", "3", "--max-len", "20", "-n", "2"},
  };
  int i = 0;
  for (const auto& args : commands) {
    const int fd = ::open("/dev/full", O_WRONLY);  // opened, never replaced
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const Outcome o = run_with_stdout(args, fd, /*ignore_sigpipe=*/false, "full" + std::to_string(i++));
    ::close(fd);
    EXPECT_EQ(o.exit_code, 1) << args[0] << ": " << o.err;
    EXPECT_NE(o.err.find("flashdllm: error: writing to stdout: No space left on device"),
              std::string::npos)
        << args[0] << ": " << o.err;
    EXPECT_EQ(count_lines(o.err), 1) << o.err;
  }
  EXPECT_TRUE(is_char_device("/dev/full"));
}

TEST(CliStdoutErrors, ClosedPipeStopsGenerationAtOnce) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // the reader is gone before the first token
  const Outcome o = run_with_stdout({"generate", "-m", stories().string(), "-p", "", "-n", "-1",
                                     "--ignore-eos", "-s", "1"},
                                    fds[1], /*ignore_sigpipe=*/true, "epipe");
  ::close(fds[1]);
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("flashdllm: error: writing to stdout: Broken pipe"), std::string::npos)
      << o.err;
  // Stopped on the first failed write: no completion summary ("generated N tokens").
  EXPECT_EQ(o.err.find("generated"), std::string::npos) << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
}

TEST(CliStdoutErrors, ClosedPipeWithDefaultSigpipeEndsTheProcess) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  const Outcome o = run_with_stdout({"generate", "-m", stories().string(), "-p", "", "-n", "-1",
                                     "--ignore-eos", "-s", "1"},
                                    fds[1], /*ignore_sigpipe=*/false, "sigpipe");
  ::close(fds[1]);
  EXPECT_NE(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.err.find("generated"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace fdl::test
