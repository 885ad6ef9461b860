// The arbiter's nice value: set for the calling thread and inherited by the threads it
// starts after, refused with what it needs. Each case runs in a child process, which
// keeps the test process's own priority.
#include "arbiter/loop/cpu_priority.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace quanta::arbiter {
namespace {

// Runs `check` in a child; its exit code (0 = passed) and what it wrote to the pipe.
std::pair<int, std::string> in_child(int (*check)(int out)) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    _exit(check(pipe_fds[1]));
  }
  close(pipe_fds[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 100, text};
}

void say(int out, const std::string& text) { (void)!write(out, text.data(), text.size()); }

TEST(CpuPriority, ARaisedValueHoldsForTheThreadAndTheThreadsItStartsAfter) {
  auto [code, text] = in_child([](int out) {
    const int before = current_nice();
    const int wanted = before < 17 ? before + 2 : 19;
    const std::string why = set_nice(wanted);
    if (!why.empty()) {
      say(out, why);
      return 1;
    }
    int seen_by_thread = 100;
    std::thread([&] { seen_by_thread = current_nice(); }).join();
    say(out, std::to_string(current_nice()) + " " + std::to_string(seen_by_thread) + " " + std::to_string(wanted));
    return current_nice() == wanted && seen_by_thread == wanted ? 0 : 2;
  });
  EXPECT_EQ(code, 0) << text;
}

TEST(CpuPriority, ALowerValueWithoutCapSysNiceIsRefusedNamingIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become an unprivileged user";
  auto [code, text] = in_child([](int out) {
    // An ordinary user, with no capabilities and no RLIMIT_NICE headroom.
    rlimit none{0, 0};
    setrlimit(RLIMIT_NICE, &none);
    if (setgid(65534) != 0 || setuid(65534) != 0) return 3;
    const int before = current_nice();
    const std::string why = set_nice(before - 1);
    say(out, why);
    return why.empty() || current_nice() != before ? 1 : 0;
  });
  ASSERT_EQ(code, 0) << text;
  EXPECT_NE(text.find("cannot set the arbiter's nice value to "), std::string::npos) << text;
  EXPECT_NE(text.find("needs CAP_SYS_NICE"), std::string::npos) << text;
}

}  // namespace
}  // namespace quanta::arbiter
