// posix_spawn with the output in files; waits poll waitpid so a deadline holds.
#include "tests/support/child.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "tests/support/temp_dir.h"

namespace quanta::test_support {
namespace {

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void sleep_ms(double ms) { usleep(static_cast<useconds_t>(ms * 1000)); }

}  // namespace

Child::Child(const std::vector<std::string>& argv, const Env& env, const std::string& out_path,
             const std::string& err_path)
    : out_path_(out_path), err_path_(err_path) {
  std::vector<std::string> env_text;
  for (const auto& [key, value] : env) env_text.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& text : env_text) envp.push_back(text.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_text = argv;
  std::vector<char*> args;
  for (auto& text : argv_text) args.push_back(text.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << " failed: " << std::strerror(rc);
    pid_ = -1;
  }
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

Child::Child(Child&& other) noexcept { *this = std::move(other); }

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    reaped_ = other.reaped_;
    out_path_ = std::move(other.out_path_);
    err_path_ = std::move(other.err_path_);
    other.pid_ = -1;
    other.reaped_ = true;
  }
  return *this;
}

bool Child::running() {
  if (pid_ <= 0 || reaped_) return false;
  int status;
  const pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

void Child::signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int Child::wait(double timeout_s) {
  if (pid_ <= 0) return -1;
  if (reaped_) return exit_code_;
  const uint64_t deadline = monotonic_ns() + static_cast<uint64_t>(timeout_s * 1e9);
  while (running()) {
    if (monotonic_ns() > deadline) return -1;
    sleep_ms(2);
  }
  return exit_code_;
}

std::string Child::out() const { return read_file(out_path_); }
std::string Child::err() const { return read_file(err_path_); }

nlohmann::json Child::json() const { return nlohmann::json::parse(out(), nullptr, false); }

nlohmann::json expect_clean_exit(Child& child, double timeout_s, const std::string& what) {
  const int code = child.wait(timeout_s);
  EXPECT_EQ(code, 0) << what << " (pid " << child.pid() << ") stderr:\n"
                     << child.err() << "\nstdout:\n"
                     << child.out();
  nlohmann::json report = child.json();
  EXPECT_TRUE(report.is_object() && report.value("ok", false))
      << what << " report: " << child.out();
  return report;
}

bool process_stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto paren = text.rfind(')');  // the command may itself hold ") "
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T';
}

}  // namespace quanta::test_support
