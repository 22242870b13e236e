#include "cli_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "test_support.h"

extern char** environ;

namespace fdl::test {
namespace {

std::vector<std::string> merged_environment(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& o : overrides) {
    const std::string name = o.substr(0, o.find('='));
    std::erase_if(env, [&](const std::string& s) { return s.rfind(name + "=", 0) == 0; });
    if (o.size() > name.size() + 1) env.push_back(o);  // "NAME=" alone means: unset
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (auto& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// Drain both pipes until the child closes them or the deadline passes. Reading both at
// once matters: a child blocked on a full stderr pipe would never finish stdout.
bool drain(int out_fd, int err_fd, std::string& out, std::string& err,
           std::chrono::steady_clock::time_point deadline) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&out, &err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int r = ::poll(fds, 2, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // EOF (or error): stop polling this one
        --open_fds;
      }
    }
  }
  return true;
}

}  // namespace

std::filesystem::path cli_binary() {
  return std::filesystem::path(FLASHDLLM_BINARY_DIR) / "bin" / "flashdllm";
}

bool cli_available() { return ::access(cli_binary().c_str(), X_OK) == 0; }

CliResult run_cli(const std::vector<std::string>& args,
                  const std::vector<std::string>& env_overrides,
                  const std::filesystem::path& cwd, std::chrono::milliseconds timeout) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());

  std::vector<std::string> argv_s;
  argv_s.push_back(cli_binary().string());
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s = merged_environment(env_overrides);
  auto argv = c_strings(argv_s);
  auto envp = c_strings(env_s);

  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
  }

  CliResult result;
  // The binary comes from this build, so a sanitized build's is as many times slower.
  const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(timeout * test::kSlowBuild);
  const bool finished = drain(out_pipe[0], err_pipe[0], result.out, result.err,
                              std::chrono::steady_clock::now() + limit);
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  if (!finished) {
    ::kill(pid, SIGKILL);
    result.timed_out = true;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (const char c : s) n += c == '\n';
  if (!s.empty() && s.back() != '\n') ++n;
  return n;
}

}  // namespace fdl::test
