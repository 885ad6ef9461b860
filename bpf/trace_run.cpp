// The bounded tracing session shared by quanta-trace's tools, and libbpf's log hook.
#include "bpf/trace_run.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace quanta::bpf {
namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_stop_signal(int) {
  g_stop = 1;
}

bool verbose_libbpf = false;

int libbpf_log(enum libbpf_print_level level, const char* format, va_list args) {
  if (!verbose_libbpf) return 0;
  char line[1024];
  std::vsnprintf(line, sizeof line, format, args);
  std::string text(line);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (level == LIBBPF_WARN) {
    spdlog::warn("{}", text);  // libbpf prefixes its own name
  } else {
    spdlog::debug("{}", text);
  }
  return 0;
}

// A zombie still answers kill(pid, 0), yet it will never run again: count it as gone.
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (!std::getline(stat, content)) return false;
  const auto close = content.rfind(')');
  return close == std::string::npos || close + 2 >= content.size() || content[close + 2] != 'Z';
}

}  // namespace

void install_libbpf_logging(bool verbose) {
  verbose_libbpf = verbose;
  libbpf_set_print(libbpf_log);
}

bool btf_tracepoint_usable(const char* tracepoint) {
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = BPF_TRACE_RAW_TP);
  const int btf_id = libbpf_find_vmlinux_btf_id(tracepoint, BPF_TRACE_RAW_TP);
  if (btf_id <= 0) return false;
  opts.attach_btf_id = static_cast<__u32>(btf_id);
  // The smallest tracing program: r0 = 0; exit.
  const bpf_insn insns[] = {
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
  };
  const int fd = bpf_prog_load(BPF_PROG_TYPE_TRACING, nullptr, "GPL", insns, 2, &opts);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

void require_processes(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (pid <= 0 || !process_alive(pid)) {
      throw TraceError("no running process with pid " + std::to_string(pid));
    }
  }
}

double run_bounded(std::chrono::duration<double> duration, const std::vector<pid_t>& pids,
                   const std::function<void(int timeout_ms)>& poll) {
  g_stop = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(duration);
  while (!g_stop) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (!pids.empty()) {
      bool any_alive = false;
      for (pid_t pid : pids) any_alive = any_alive || process_alive(pid);
      if (!any_alive) break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    poll(static_cast<int>(std::min<long long>(left.count() + 1, 100)));
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace quanta::bpf
