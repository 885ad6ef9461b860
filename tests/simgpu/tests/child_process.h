// Test helper: runs a scenario in a forked child with its own SIMGPU_* environment (the
// driver reads its configuration once per process) and reports how it ended, with the
// child's stderr. Also names a unique shared state per test and removes it afterwards.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace quanta::simgpu::test {

using Env = std::vector<std::pair<std::string, std::string>>;

// A shared-state name no other test (or parallel test run) uses; unlinked on scope exit.
class UniqueState {
 public:
  explicit UniqueState(const std::string& tag)
      : name_("simgpu-test-" + tag + "-" + std::to_string(getpid())) {
    shm_unlink(("/" + name_).c_str());
  }
  ~UniqueState() { shm_unlink(("/" + name_).c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

struct Child {
  pid_t pid = -1;
  int stderr_fd = -1;
};

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string stderr_text;
};

// Starts `body` in a child with `env` applied; the child's exit status is body's return.
inline Child start_child(const Env& env, const std::function<int()>& body) {
  int err[2];
  if (pipe(err) != 0) std::abort();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    close(err[0]);
    dup2(err[1], STDERR_FILENO);
    close(err[1]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    const int code = body();
    std::fflush(nullptr);
    _exit(code);
  }
  close(err[1]);
  return Child{pid, err[0]};
}

inline ChildResult finish_child(Child child) {
  ChildResult result;
  char buf[4096];
  ssize_t n;
  while ((n = read(child.stderr_fd, buf, sizeof buf)) > 0)
    result.stderr_text.append(buf, static_cast<size_t>(n));
  close(child.stderr_fd);
  int status = 0;
  waitpid(child.pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

inline ChildResult run_child(const Env& env, const std::function<int()>& body) {
  return finish_child(start_child(env, body));
}

}  // namespace quanta::simgpu::test

// Inside a child: report the failed condition on stderr and exit non-zero.
#define CHILD_CHECK(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

#define CHILD_CU(call)                                                                         \
  do {                                                                                         \
    CUresult child_cu_rc = (call);                                                             \
    if (child_cu_rc != CUDA_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, child_cu_rc); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)
