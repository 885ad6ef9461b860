// quanta-arbiter's entry point: command line, config, logging, detaching, waiting for the
// node's GPUs; everything else is Arbiter's. Errors reach here as exceptions and end the
// process with one clear line.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "arbiter/arbiter.h"
#include "arbiter/context_overhead.h"
#include "arbiter/loop/cpu_priority.h"
#include "arbiter/observing/gpu_inventory.h"
#include "common/version.h"
#include "config/node_config.h"

namespace {

constexpr int kGpuRetrySeconds = 5;
constexpr int kGpuReminderSeconds = 60;

// One line for --check-config: what a person wants to know the file will do.
std::string config_summary(const quanta::config::NodeConfig& c) {
  std::string gpus =
      c.gpus.empty() ? "every GPU NVML lists" : std::to_string(c.gpus.size()) + " listed GPU(s)";
  return c.source + ": ok (scope " + c.scope + ", tenant socket " + c.tenant_socket +
         ", admin socket " + c.admin_socket + ", state " + c.state_dir + ", " + gpus +
         ", metrics " + (c.metrics.listen.empty() ? "off" : "on " + c.metrics.listen) + ", nice " +
         std::to_string(c.nice) + ", " +
         std::to_string(c.pods.size()) + " [pod] table(s))";
}

// A node agent can start before the driver is loaded or the GPU operator has finished:
// retry discovery instead of exiting into a crash loop. Returns false when SIGTERM or
// SIGINT arrives meanwhile (a clean stop, not an error).
bool wait_for_gpus(const quanta::config::NodeConfig& config) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, nullptr);  // the Arbiter's signalfd takes them over later
  const time_t started = time(nullptr);
  time_t reminded = 0;
  std::string last_reason;
  for (;;) {
    std::string reason;
    try {
      if (!quanta::arbiter::discover_gpus(config.gpus).empty()) break;
      reason = "NVML reports no GPU";
    } catch (const std::exception& e) {
      reason = e.what();
    }
    const time_t now = time(nullptr);
    if (reason != last_reason || now - reminded >= kGpuReminderSeconds) {
      spdlog::warn("waiting for GPUs ({} s so far): {}; retrying every {} s", now - started, reason,
                   kGpuRetrySeconds);
      last_reason = reason;
      reminded = now;
    }
    timespec pause{kGpuRetrySeconds, 0};
    siginfo_t info{};
    if (sigtimedwait(&stop, &info, &pause) > 0) {
      spdlog::info("signal {} received while waiting for GPUs: stopping", info.si_signo);
      return false;
    }
  }
  if (!last_reason.empty()) {
    spdlog::info("GPUs present after {} s of waiting", time(nullptr) - started);
  }
  return true;
}

// Detaching. The parent forks and waits for the detached child's first word: "ok" once it
// serves its sockets, or why it cannot (another arbiter holds the scope's lock, a socket
// cannot be bound). It exits 0 or 1 with that, so an init script or a person starting
// quanta-arbiter by hand sees a failed start as one.
int detached_report_fd = -1;

void detach(const std::string& log_path) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("cannot detach: pipe: ") + std::strerror(errno));
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error(std::string("cannot detach: fork: ") + std::strerror(errno));
  if (child > 0) {
    ::close(fds[1]);
    std::string word;
    char buf[1024];
    for (;;) {
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n > 0) {
        word.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    if (word.rfind("ok", 0) == 0) {
      std::fprintf(stderr, "quanta-arbiter: detached as pid %d%s; log in %s\n", child,
                   word.substr(2).c_str(), log_path.c_str());
      _exit(0);
    }
    if (word.empty()) word = "the detached arbiter exited before it served; see " + log_path;
    // It exits right after saying why: gone when this command returns.
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "quanta-arbiter: %s\n", word.c_str());
    _exit(1);
  }
  ::close(fds[0]);
  detached_report_fd = fds[1];
  if (setsid() < 0 || chdir("/") != 0) throw std::runtime_error("cannot detach: setsid or chdir failed");
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
    ::close(null);
  }
}

// In the detached child: tells the waiting parent ("ok…" or an error line) and lets it go.
void report_detached(const std::string& word) {
  if (detached_report_fd < 0) return;
  size_t done = 0;
  while (done < word.size()) {
    const ssize_t n = ::write(detached_report_fd, word.data() + done, word.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(detached_report_fd);
  detached_report_fd = -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "quanta-arbiter: hands out GPU time quanta and memory caps to the pods on this node"};
  app.set_version_flag("--version", quanta::common::version_line("quanta-arbiter"));
  std::string config_path;
  bool foreground = false;
  bool check_config = false;
  bool wait_gpus = false;
  std::string level = "info";
  bool logging = false;  // until the logger is set up, errors go to stderr only
  app.add_option(
      "--config", config_path,
      "node config (default /etc/quanta/quanta.toml, else the source tree's config/quanta.toml)");
  app.add_flag("--foreground", foreground,
               "stay attached and log to stderr, as a container runtime expects (otherwise "
               "detach and log to <state_dir>/quanta-arbiter.log)");
  app.add_flag("--check-config", check_config,
               "load and validate the config, print one line and exit (0 when it is valid)");
  app.add_flag("--wait-for-gpus", wait_gpus,
               "when NVML is missing or lists no GPU (or not every [node] gpus entry), log why "
               "and retry every 5 s instead of exiting");
  app.add_option("--log-level", level, "trace, debug, info, warn or error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  // The child the arbiter runs at start to measure a context's cost (context_overhead.h).
  std::string measure_uuid;
  app.add_option("--measure-context-overhead", measure_uuid)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a usage error exits 2, as other tools' do
  }
  if (!measure_uuid.empty()) return quanta::arbiter::measure_context_overhead_here(measure_uuid);

  try {
    if (config_path.empty()) {
      config_path = std::filesystem::exists("/etc/quanta/quanta.toml") ? "/etc/quanta/quanta.toml"
                                                                       : QUANTA_SOURCE_CONFIG;
    }
    quanta::config::NodeConfig config = quanta::config::load_config(config_path);
    if (check_config) {
      std::printf("quanta-arbiter: %s\n", config_summary(config).c_str());
      return 0;
    }
    spdlog::set_default_logger(spdlog::stderr_color_mt("quanta-arbiter-stderr"));
    spdlog::set_level(spdlog::level::from_str(level));
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    logging = true;
    // Every tenant costs a connection, a doorbell and a pidfd: take all the descriptors allowed.
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
    if (!foreground) {
      // Detach before the Arbiter exists: its signalfd's epoll registration belongs to the
      // process that made it, so a child forked afterwards would never see SIGTERM.
      std::filesystem::create_directories(config.state_dir);
      const std::string log_path = config.state_dir + "/quanta-arbiter.log";
      auto file = spdlog::basic_logger_mt("quanta-arbiter", log_path);
      file->set_level(spdlog::level::from_str(level));
      spdlog::set_default_logger(file);
      spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
      spdlog::flush_on(spdlog::level::info);
      detach(log_path);
    }
    // Before any thread starts: they inherit it.
    const std::string not_nice = quanta::arbiter::set_nice(config.nice);
    if (!not_nice.empty()) {
      spdlog::warn("{}; running at nice {}, so under CPU load grants wait longer for a CPU", not_nice,
                   quanta::arbiter::current_nice());
    }
    if (wait_gpus) {
      // Waiting may take as long as the driver does: the parent is let go at once.
      report_detached("ok (waiting for GPUs if there are none yet)");
      if (!wait_for_gpus(config)) return 0;
    }
    quanta::arbiter::Arbiter arbiter(config);
    report_detached("ok");
    arbiter.run();
  } catch (const std::exception& e) {
    if (logging) spdlog::error("{}", e.what());  // reaches the log file once detached
    report_detached(e.what());
    std::fprintf(stderr, "quanta-arbiter: %s\n", e.what());
    return 1;
  }
  return 0;
}
