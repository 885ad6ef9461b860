// Child processes of a benchmark run: an environment built from ours plus overrides, a
// spawn that sends stdout and stderr to files, waiting with a deadline, and the CPU time
// a live process has used (from /proc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace quanta::bench {

// Our own environment with some variables replaced or removed (empty optional = unset).
class Environment {
 public:
  Environment& set(const std::string& name, const std::string& value);
  Environment& unset(const std::string& name);
  std::vector<std::string> materialize() const;

 private:
  std::map<std::string, std::optional<std::string>> overrides_;
};

struct ExitStatus {
  bool exited = false;  // false: killed by a signal (or still running at the deadline)
  int code = -1;        // exit code, or the signal number when !exited
  bool timed_out = false;
  std::string describe() const;  // "exit 0", "signal 9", "timed out"
};

class Process {
 public:
  // Starts argv[0] (a path) with env; stdout and stderr go to the named files. With
  // `cgroup_procs` (a cgroup.procs file) the child moves itself into that cgroup before it
  // runs the program, so nothing it does happens outside it. Throws std::runtime_error
  // naming the program (and the cgroup) when the spawn fails.
  static Process spawn(const std::vector<std::string>& argv, const Environment& env,
                       const std::string& stdout_path, const std::string& stderr_path,
                       const std::string& cgroup_procs = "");

  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // a process still running is killed and reaped

  pid_t pid() const { return pid_; }
  // Reaps the process if it has ended (a zombie is not running).
  bool running() { return pid_ > 0 && !poll(); }
  // Waits until the process ends or the deadline passes (then SIGKILLs it).
  ExitStatus wait(std::chrono::milliseconds deadline);
  // SIGTERM, then SIGKILL after grace.
  ExitStatus stop(std::chrono::milliseconds grace);
  const std::string& stdout_path() const { return stdout_path_; }
  const std::string& stderr_path() const { return stderr_path_; }
  const std::string& program() const { return program_; }

 private:
  bool poll();
  pid_t pid_ = -1;
  std::optional<ExitStatus> status_;
  std::string stdout_path_;
  std::string stderr_path_;
  std::string program_;
};

// CPU time of a live process (all threads) in seconds: from /proc/<pid>/task/*/schedstat
// (ns), else utime + stime of /proc/<pid>/stat; empty when neither is readable.
std::optional<double> process_cpu_seconds(pid_t pid);

std::string read_file(const std::string& path);
std::string last_line(const std::string& text);  // last non-empty line, for error notes
bool file_exists(const std::string& path);

// A private directory under $TMPDIR (or /tmp) removed with its files at destruction,
// unless QUANTA_BENCH_KEEP is set (then its path is logged).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace quanta::bench
