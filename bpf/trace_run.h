// What every quanta-trace tool shares: the error type main prints, the libbpf log hook,
// and the bounded session loop (a duration, Ctrl-C, or the traced processes exiting).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hosted/errno_text.h"

namespace quanta::bpf {

// A failure the user can act on; main prints what() as one line and exits non-zero.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Routes libbpf's own messages to the log: all of them when verbose, none otherwise
// (the tools report failures themselves, naming what failed).
void install_libbpf_logging(bool verbose);

// errno's and libbpf's failures in messages: hosted::errno_text ("Operation not
// permitted (errno 1)").
using hosted::errno_text;

// Whether this kernel can attach BTF tracepoint programs (tp_btf) to `tracepoint`, e.g.
// "sched_switch": it needs vmlinux BTF and Linux >= 5.5. libbpf-tools' runqlat probes the
// same way and falls back to raw tracepoints when the answer is no.
bool btf_tracepoint_usable(const char* tracepoint);

// Throws TraceError unless every pid names a live process.
void require_processes(const std::vector<pid_t>& pids);

// Runs `poll(timeout_ms)` repeatedly until `duration` has passed, SIGINT/SIGTERM arrives,
// or (when `pids` is not empty) every listed process has exited. Returns the seconds run.
double run_bounded(std::chrono::duration<double> duration, const std::vector<pid_t>& pids,
                   const std::function<void(int timeout_ms)>& poll);

}  // namespace quanta::bpf
