// Processes a test starts: spawned with an exact environment, their stdout and stderr in
// files, waited for with a deadline, killed and reaped if the test ends first.
#pragma once

#include <sys/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace quanta::test_support {

using Env = std::map<std::string, std::string>;

// A spawned process whose stdout and stderr go to files.
class Child {
 public:
  Child() = default;
  Child(const std::vector<std::string>& argv, const Env& env, const std::string& out_path, const std::string& err_path);
  ~Child();
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig);
  // Waits until exit; returns the exit code (128 + signal when killed), -1 on timeout.
  int wait(double timeout_s);
  int exit_code() const { return exit_code_; }
  std::string out() const;
  std::string err() const;
  nlohmann::json json() const;  // stdout as one JSON value (discarded when it is not)

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  bool reaped_ = false;
  std::string out_path_;
  std::string err_path_;
};

// Waits for `child` and expects a clean run: exit 0 and a JSON report with "ok": true on
// stdout (quanta-tenant's). Returns the report; `what` names the child in failures.
nlohmann::json expect_clean_exit(Child& child, double timeout_s, const std::string& what);

// Whether `pid` is stopped (state T in /proc/<pid>/stat), as SIGSTOP leaves it.
bool process_stopped(pid_t pid);

}  // namespace quanta::test_support
