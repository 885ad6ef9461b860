// End-to-end tests of quanta-trace: the real BPF programs loaded and attached by the real
// binary, against processes whose behaviour is known (sleeping children, usdt_emitter).
// They need root, kernel BTF and tracefs; without them they skip, or fail when
// QUANTA_REQUIRE_BPF=1 (CI), naming what is missing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/temp_dir.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Empty when BPF tests can run here; else why not. Mounts tracefs when it is missing.
std::string missing_bpf_precondition() {
  if (::geteuid() != 0) return "eBPF tests need root";
  if (::access("/sys/kernel/btf/vmlinux", R_OK) != 0) {
    return "kernel BTF /sys/kernel/btf/vmlinux is missing (CONFIG_DEBUG_INFO_BTF)";
  }
  if (::access("/sys/kernel/tracing/events", F_OK) != 0 &&
      ::mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, nullptr) != 0 && errno != EBUSY) {
    return std::string("tracefs is not mounted and mounting it failed: ") + std::strerror(errno);
  }
  return {};
}

// A missing precondition skips the test, or fails it where CI sets QUANTA_REQUIRE_BPF=1.
#define REQUIRE_OR_SKIP(missing_precondition)                    \
  do {                                                           \
    const std::string why = (missing_precondition);              \
    if (!why.empty()) {                                          \
      const char* require = std::getenv("QUANTA_REQUIRE_BPF");   \
      if (require && std::string(require) == "1") FAIL() << why; \
      GTEST_SKIP() << why;                                       \
    }                                                            \
  } while (0)
#define REQUIRE_BPF_OR_SKIP() REQUIRE_OR_SKIP(missing_bpf_precondition())

using quanta::test_support::TempDir;

// A child process with its stdin writable and its stdout/stderr readable through pipes.
class Process {
 public:
  explicit Process(std::vector<std::string> argv) {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) {
      throw std::runtime_error("pipe2 failed");
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    stderr_ = err[0];
  }
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {stdin_, stdout_, stderr_}) {
      if (fd >= 0) ::close(fd);
    }
  }
  pid_t pid() const { return pid_; }

  void write_stdin(const std::string& text) {
    ASSERT_EQ(::write(stdin_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }

  // Reads stderr until it contains `needle`; false on EOF or after `timeout`.
  bool wait_for_stderr(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (err_text_.find(needle) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{stderr_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::read(stderr_, buf, sizeof buf);
      if (n <= 0) return false;
      err_text_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  // Drains stdout and stderr to EOF, then reaps the process; returns its exit code.
  int finish() {
    std::thread err_reader([this] { err_text_ += drain(stderr_); });
    out_text_ = drain(stdout_);
    err_reader.join();
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // Reaps a process that ends on its own (usdt_emitter), ignoring its output.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  const std::string& out() const { return out_text_; }
  const std::string& err() const { return err_text_; }

 private:
  static std::string drain(int fd) {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    return text;
  }

  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1, stderr_ = -1;
  std::string out_text_, err_text_;
};

// A forked child that sleeps 1 ms and wakes, forever: steady scheduler traffic.
class SleepyChild {
 public:
  SleepyChild() {
    pid_ = ::fork();
    if (pid_ == 0) {
      const timespec one_ms{0, 1000000};
      for (;;) ::nanosleep(&one_ms, nullptr);
    }
  }
  ~SleepyChild() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

using quanta::test_support::read_file;

int run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(BpfOffcpu, ReportsHistogramsOnlyForTheRequestedProcess) {
  REQUIRE_BPF_OR_SKIP();
  SleepyChild traced;
  SleepyChild untraced;
  Process trace({QUANTA_TRACE_PATH, "offcpu", "--pid", std::to_string(traced.pid()), "--duration",
                 "1", "--json"});
  ASSERT_EQ(trace.finish(), 0) << trace.err();
  const json report = json::parse(trace.out());
  ASSERT_EQ(report["processes"].size(), 1u) << report.dump(2);
  const json& process = report["processes"][0];
  EXPECT_EQ(process["tgid"], traced.pid());
  EXPECT_EQ(report["tracepoints"], "tp_btf");
  // ~1000 wakeups in one second; a loaded machine still gives far more than 50.
  EXPECT_GT(process["off_cpu"]["count"].get<uint64_t>(), 50u);
  EXPECT_GT(process["runq_latency"]["count"].get<uint64_t>(), 50u);
  EXPECT_FALSE(process["off_cpu"]["buckets"].empty());
  // Off-CPU spells are the 1 ms sleeps: the median lies well inside 0.1 ms .. 100 ms.
  const double off_p50 = process["off_cpu"]["p50_ns"];
  EXPECT_GT(off_p50, 1e5);
  EXPECT_LT(off_p50, 1e8);
  for (const json& p : report["processes"]) EXPECT_NE(p["tgid"], untraced.pid());
}

TEST(BpfOffcpu, RawTracepointsGiveTheSameHistogramsWhereBtfOnesAreMissing) {
  REQUIRE_BPF_OR_SKIP();
  SleepyChild traced;
  Process trace({QUANTA_TRACE_PATH, "offcpu", "--raw-tracepoints", "--pid",
                 std::to_string(traced.pid()), "--duration", "1", "--json"});
  ASSERT_EQ(trace.finish(), 0) << trace.err();
  const json report = json::parse(trace.out());
  EXPECT_EQ(report["tracepoints"], "raw_tp");
  ASSERT_EQ(report["processes"].size(), 1u) << report.dump(2);
  EXPECT_GT(report["processes"][0]["off_cpu"]["count"].get<uint64_t>(), 50u);
  EXPECT_GT(report["processes"][0]["runq_latency"]["count"].get<uint64_t>(), 50u);
}

TEST(BpfOffcpu, PidThatDoesNotExistIsRejectedByNumber) {
  REQUIRE_BPF_OR_SKIP();
  Process trace({QUANTA_TRACE_PATH, "offcpu", "--pid", "999999999", "--duration", "1"});
  EXPECT_EQ(trace.finish(), 1);
  EXPECT_NE(trace.err().find("no running process with pid 999999999"), std::string::npos)
      << trace.err();
}

TEST(BpfOffcpu, PrometheusOutputPassesPromtool) {
  REQUIRE_BPF_OR_SKIP();
  REQUIRE_OR_SKIP(run_shell("command -v promtool >/dev/null") == 0
                      ? std::string()
                      : std::string("promtool is not installed (Debian package prometheus)"));
  SleepyChild traced;
  TempDir dir{"quanta-bpf-test"};
  const fs::path metrics = fs::path(dir.file("offcpu.prom"));
  Process trace({QUANTA_TRACE_PATH, "offcpu", "--pid", std::to_string(traced.pid()), "--duration",
                 "0.5", "--prometheus", metrics.string()});
  ASSERT_EQ(trace.finish(), 0) << trace.err();
  const std::string text = read_file(metrics);
  EXPECT_NE(text.find("# TYPE quanta_offcpu_off_cpu_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("quanta_offcpu_off_cpu_seconds_count{pid=\"" + std::to_string(traced.pid()) +
                      "\"}"),
            std::string::npos)
      << text;
  EXPECT_EQ(run_shell("promtool check metrics < '" + metrics.string() + "'"), 0) << text;
}

struct HandoffRun {
  int rc = -1;
  json report;
  std::string stderr_text;
};

// usdt_emitter with `rounds` turns per slot (each held 500 us unless `emitter_args` say
// otherwise), traced from before its first probe to its exit.
HandoffRun trace_emitter(int rounds, const std::vector<std::string>& extra_args,
                         const std::vector<std::string>& emitter_args = {}) {
  HandoffRun run;
  std::vector<std::string> emitter_argv = {USDT_EMITTER_PATH, "--rounds", std::to_string(rounds),
                                           "--hold-us",       "500",      "--device",
                                           "3"};
  emitter_argv.insert(emitter_argv.end(), emitter_args.begin(), emitter_args.end());
  Process emitter(emitter_argv);
  std::vector<std::string> args = {QUANTA_TRACE_PATH, "handoff", "--binary",
                                   USDT_EMITTER_PATH, "--pid",   std::to_string(emitter.pid()),
                                   "--duration",      "8",       "--json"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Process trace(args);
  // The tool prints "Tracing" once every probe is attached: only then may the emitter start.
  const bool attached = trace.wait_for_stderr("Tracing", std::chrono::seconds(5));
  emitter.write_stdin("go\n");
  EXPECT_EQ(emitter.wait(), 0);
  run.rc = trace.finish();
  run.stderr_text = trace.err();
  EXPECT_TRUE(attached) << run.stderr_text;
  if (run.rc == 0) run.report = json::parse(trace.out());
  return run;
}

TEST(BpfHandoff, CountsEveryHandoffBetweenAlternatingSlots) {
  REQUIRE_BPF_OR_SKIP();
  constexpr int kRounds = 25;
  const HandoffRun run = trace_emitter(kRounds, {});
  ASSERT_EQ(run.rc, 0) << run.stderr_text;
  const json& r = run.report;
  for (const char* probe : {"gate_wait_begin", "gate_wait_end", "release", "grant"}) {
    EXPECT_EQ(r["probes"][probe], 2 * kRounds) << probe;
  }
  // Strict alternation: every gate_wait_end but the first follows the other slot's release.
  EXPECT_EQ(r["handoff_latency"]["count"], 2 * kRounds - 1);
  EXPECT_EQ(r["gate_wait"]["count"], 2 * kRounds);
  ASSERT_EQ(r["devices"].size(), 1u);
  EXPECT_EQ(r["devices"][0]["device"], 3);
  // A handoff is one condition-variable wake-up (tens of microseconds here); the bound is
  // generous because the machine is shared and noisy.
  const double p50 = r["handoff_latency"]["p50_ns"];
  EXPECT_GT(p50, 0.0);
  EXPECT_LT(p50, 50e6);
  // Each waiter waits about one hold of the other slot (500 us).
  const double wait_p50 = r["gate_wait"]["p50_ns"];
  EXPECT_GT(wait_p50, 250e3);
}

TEST(BpfHandoff, TimesEachHandoffByTheStampsTheProbesCarry) {
  REQUIRE_BPF_OR_SKIP();
  // Each release is stamped 1 ms before its probe fires: by the stamps every handoff takes
  // over 1 ms, where the kernel's times at the probes would give one wake-up (tens of us).
  constexpr int kRounds = 10;
  const HandoffRun run =
      trace_emitter(kRounds, {}, {"--hold-us", "5000", "--release-stamp-lead-us", "1000"});
  ASSERT_EQ(run.rc, 0) << run.stderr_text;
  EXPECT_EQ(run.report["handoff_latency"]["count"], 2 * kRounds - 1);
  // p50 is interpolated inside its factor-of-two bucket: over 1 ms lies in [2^19, 2^21) ns.
  EXPECT_GT(run.report["handoff_latency"]["p50_ns"].get<double>(), 524288.0)
      << run.report["handoff_latency"].dump();
}

TEST(BpfHandoff, AWaiterThatArrivedAfterTheReleaseTimesNoHandoff) {
  REQUIRE_BPF_OR_SKIP();
  // Each release is stamped 200 ms before its probe, far longer than the 500 us hold the
  // other slot waits for (even stretched by a loaded machine): every waiter came after the
  // release it follows, so none of its passes is a handoff, while every wait is counted.
  constexpr int kRounds = 10;
  const HandoffRun run = trace_emitter(kRounds, {}, {"--release-stamp-lead-us", "200000"});
  ASSERT_EQ(run.rc, 0) << run.stderr_text;
  EXPECT_EQ(run.report["handoff_latency"]["count"], 0) << run.report.dump();
  EXPECT_EQ(run.report["gate_wait"]["count"], 2 * kRounds);
}

TEST(BpfHandoff, TimelineIsChromeTraceJsonWithEveryProbeAndHandoff) {
  REQUIRE_BPF_OR_SKIP();
  constexpr int kRounds = 10;
  TempDir dir{"quanta-bpf-test"};
  const fs::path timeline = fs::path(dir.file("timeline.json"));
  const auto monotonic_ns = [] {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(now.tv_nsec);
  };
  const uint64_t before_ns = monotonic_ns();
  const HandoffRun run = trace_emitter(kRounds, {"--timeline", timeline.string()});
  const uint64_t after_ns = monotonic_ns();
  ASSERT_EQ(run.rc, 0) << run.stderr_text;
  const json trace = json::parse(read_file(timeline));
  ASSERT_TRUE(trace.contains("traceEvents"));
  // Event times count from the first event, whose clock time lines the timeline up with
  // other CLOCK_MONOTONIC logs.
  const uint64_t first_ns = trace["otherData"].value("first_event_ns", uint64_t{0});
  EXPECT_GT(first_ns, before_ns);
  EXPECT_LT(first_ns, after_ns);
  std::map<std::string, int> by_name;
  std::set<int> tids;
  for (const json& e : trace["traceEvents"]) {
    by_name[e["name"]]++;
    ASSERT_TRUE(e.contains("pid") && e.contains("tid") && e.contains("ts")) << e.dump();
    EXPECT_EQ(e["args"]["device"], 3);
    tids.insert(e["tid"].get<int>());
    if (e["ph"] == "X") {
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    }
    // A handoff is shown on the waiter that passed its gate, from the other slot.
    if (e["name"] == "handoff") {
      EXPECT_NE(e["args"]["slot"], e["args"]["from_slot"]) << e.dump();
    }
  }
  EXPECT_EQ(by_name["grant"], 2 * kRounds);
  EXPECT_EQ(by_name["release"], 2 * kRounds);
  EXPECT_EQ(by_name["gate_wait"], 2 * kRounds);
  EXPECT_EQ(by_name["hold"], 2 * kRounds);
  EXPECT_EQ(by_name["handoff"], 2 * kRounds - 1);
  EXPECT_EQ(tids.size(), 2u);  // the two slot threads
  EXPECT_EQ(run.report["timeline"]["events_lost"], 0);
}

TEST(BpfHandoff, PrometheusOutputPassesPromtool) {
  REQUIRE_BPF_OR_SKIP();
  REQUIRE_OR_SKIP(run_shell("command -v promtool >/dev/null") == 0
                      ? std::string()
                      : std::string("promtool is not installed (Debian package prometheus)"));
  TempDir dir{"quanta-bpf-test"};
  const fs::path metrics = fs::path(dir.file("handoff.prom"));
  const HandoffRun run = trace_emitter(5, {"--prometheus", metrics.string()});
  ASSERT_EQ(run.rc, 0) << run.stderr_text;
  const std::string text = read_file(metrics);
  EXPECT_NE(text.find("# TYPE quanta_handoff_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("quanta_handoff_latency_seconds_count{device=\"3\"} 9"), std::string::npos)
      << text;
  EXPECT_EQ(run_shell("promtool check metrics < '" + metrics.string() + "'"), 0) << text;
}

TEST(BpfHandoff, MissingBinaryIsNamedInTheError) {
  Process trace(
      {QUANTA_TRACE_PATH, "handoff", "--binary", "/nonexistent/quanta-app", "--duration", "1"});
  EXPECT_EQ(trace.finish(), 1);
  EXPECT_NE(trace.err().find("'/nonexistent/quanta-app' does not exist"), std::string::npos)
      << trace.err();
}

TEST(BpfHandoff, BinaryWithoutQuantaProbesNamesBinaryAndProbe) {
  REQUIRE_BPF_OR_SKIP();
  // quanta-trace itself is an ELF file with no quanta:* probes.
  Process trace({QUANTA_TRACE_PATH, "handoff", "--binary", QUANTA_TRACE_PATH, "--duration", "1"});
  EXPECT_EQ(trace.finish(), 1);
  const std::string expected =
      std::string("binary '") + QUANTA_TRACE_PATH + "' has no USDT probe quanta:gate_wait_begin";
  EXPECT_NE(trace.err().find(expected), std::string::npos) << trace.err();
}

}  // namespace
