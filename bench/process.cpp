// Spawning, waiting for and measuring the benchmark's child processes.
#include "bench/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace quanta::bench {

Environment& Environment::set(const std::string& name, const std::string& value) {
  overrides_[name] = value;
  return *this;
}

Environment& Environment::unset(const std::string& name) {
  overrides_[name] = std::nullopt;
  return *this;
}

std::vector<std::string> Environment::materialize() const {
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    auto equals = text.find('=');
    std::string name = text.substr(0, equals);
    if (overrides_.count(name) == 0) out.push_back(text);
  }
  for (const auto& [name, value] : overrides_) {
    if (value) out.push_back(name + "=" + *value);
  }
  return out;
}

std::string ExitStatus::describe() const {
  if (timed_out) return "timed out";
  if (exited) return "exit " + std::to_string(code);
  return std::string("signal ") + std::to_string(code) + " (" + strsignal(code) + ")";
}

Process Process::spawn(const std::vector<std::string>& argv, const Environment& env,
                       const std::string& stdout_path, const std::string& stderr_path,
                       const std::string& cgroup_procs) {
  // Everything the child needs is built before fork: between fork and exec it only makes
  // async-signal-safe calls (the bench has threads).
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings = env.materialize();
  std::vector<char*> envp;
  for (auto& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);

  // What failed in the child, and its errno: written to a pipe that exec closes.
  enum Stage : int { kRedirect = 1, kCgroup = 2, kExec = 3 };
  struct ChildError {
    int stage = 0;
    int error = 0;
  };
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int error = errno;
    close(report[0]);
    close(report[1]);
    throw std::runtime_error("cannot start " + argv.at(0) + ": fork failed: " + std::strerror(error));
  }
  if (pid == 0) {
    // A bench killed mid-run (a test timeout) must not leave arbiters and tenants behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int in = open("/dev/null", O_RDONLY);
    int out = open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    auto fail = [&](int stage) {
      ChildError failure{stage, errno};
      (void)!write(report[1], &failure, sizeof failure);
      _exit(127);
    };
    if (in < 0 || out < 0 || err < 0 || dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
        dup2(err, STDERR_FILENO) < 0) {
      fail(kRedirect);
    }
    if (!cgroup_procs.empty()) {
      // "0" is the writer itself, in cgroup v1 and v2 alike.
      int procs = open(cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (procs < 0 || write(procs, "0", 1) != 1) fail(kCgroup);
      close(procs);
    }
    execve(args[0], args.data(), envp.data());
    fail(kExec);
  }
  close(report[1]);
  ChildError child_error;
  ssize_t got = read(report[0], &child_error, sizeof child_error);
  close(report[0]);
  if (got == static_cast<ssize_t>(sizeof child_error)) {
    int raw = 0;
    waitpid(pid, &raw, 0);
    std::string where = child_error.stage == kCgroup
                            ? "cannot move into cgroup " +
                                  std::filesystem::path(cgroup_procs).parent_path().string() + ": "
                            : "";
    throw std::runtime_error("cannot start " + argv.at(0) + ": " + where +
                             std::strerror(child_error.error));
  }
  Process process;
  process.pid_ = pid;
  process.stdout_path_ = stdout_path;
  process.stderr_path_ = stderr_path;
  process.program_ = std::filesystem::path(argv.at(0)).filename().string();
  return process;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (running()) stop(std::chrono::milliseconds(200));
    pid_ = other.pid_;
    status_ = other.status_;
    stdout_path_ = std::move(other.stdout_path_);
    stderr_path_ = std::move(other.stderr_path_);
    program_ = std::move(other.program_);
    other.pid_ = -1;
    other.status_.reset();
  }
  return *this;
}

Process::~Process() {
  if (running()) stop(std::chrono::milliseconds(200));
}

bool Process::poll() {
  if (pid_ <= 0 || status_) return true;
  int raw = 0;
  pid_t done = waitpid(pid_, &raw, WNOHANG);
  if (done == 0) return false;
  ExitStatus status;
  if (done == pid_ && WIFEXITED(raw)) {
    status.exited = true;
    status.code = WEXITSTATUS(raw);
  } else if (done == pid_ && WIFSIGNALED(raw)) {
    status.code = WTERMSIG(raw);
  }
  status_ = status;
  return true;
}

ExitStatus Process::wait(std::chrono::milliseconds deadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  // Children end at a time they were told (--seconds); a 5 ms poll costs nothing there
  // and keeps this free of SIGCHLD plumbing.
  while (!poll()) {
    if (std::chrono::steady_clock::now() >= until) {
      kill(pid_, SIGKILL);
      int raw = 0;
      waitpid(pid_, &raw, 0);
      ExitStatus status;
      status.timed_out = true;
      status.code = SIGKILL;
      status_ = status;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return *status_;
}

ExitStatus Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return ExitStatus{};
  if (!running()) return *status_;
  kill(pid_, SIGTERM);
  auto until = std::chrono::steady_clock::now() + grace;
  while (!poll() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!poll()) {
    kill(pid_, SIGKILL);
    int raw = 0;
    waitpid(pid_, &raw, 0);
    ExitStatus status;
    status.code = SIGKILL;
    status_ = status;
  }
  return *status_;
}

std::optional<double> process_cpu_seconds(pid_t pid) {
  // Nanoseconds on CPU of every thread (schedstat) where the kernel keeps them: the
  // clock-tick utime+stime of /proc/<pid>/stat cannot resolve a daemon that is idle
  // most of the time.
  std::error_code error;
  std::string proc = "/proc/" + std::to_string(pid);
  double schedstat_seconds = 0;
  bool have_schedstat = false;
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task", error)) {
    std::ifstream in(task.path() / "schedstat");
    unsigned long long on_cpu_ns = 0;
    if (in >> on_cpu_ns) {
      schedstat_seconds += static_cast<double>(on_cpu_ns) / 1e9;
      have_schedstat = true;
    }
  }
  if (!error && have_schedstat) return schedstat_seconds;

  std::ifstream in(proc + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name may hold spaces and parentheses: fields count from the last ')'.
  auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // After the name: state(3) ppid(4) ... utime(14) stime(15); index 0 here is field 3.
  for (int index = 0; fields >> field; ++index) {
    if (index == 11) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (index == 12) {
      stime = std::strtoull(field.c_str(), nullptr, 10);
      return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return std::nullopt;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string last_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

bool file_exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    throw std::runtime_error("cannot create a temporary directory " + pattern + ": " + std::strerror(errno));
  }
  path_ = buffer.data();
}

TempDir::~TempDir() {
  if (std::getenv("QUANTA_BENCH_KEEP") != nullptr) {
    spdlog::info("kept {}", path_);
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace quanta::bench
