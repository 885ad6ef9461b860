// Handoffs paired from the handoff tool's events (handoff.h): on each device, a `release` by
// one waiter (a slot of a process) to the next `gate_wait_end` of another waiter that was
// already waiting at its gate when the GPU was released. Pure: quanta-trace's timeline and quanta-bench's
// handoff figures both pair with it, and tests/bpf/handoff_model_test.cpp holds it.
#pragma once

#include <cstdint>
#include <vector>

#include "bpf/handoff.h"

namespace quanta::bpf {

struct Handoff {
  uint32_t device = 0;
  uint32_t from_pid = 0;  // the releasing process
  uint32_t from_slot = 0;
  uint32_t to_pid = 0;  // the process that passed its gate next, its thread and slot
  uint32_t to_tid = 0;
  uint32_t to_slot = 0;
  uint64_t released_ns = 0;  // CLOCK_MONOTONIC, the releaser's stamp
  double us = 0;             // until the next process passed its gate
  // The next waiter's first pass of its gate after a wait: the first time it runs after
  // starting, part of its start-up rather than a handoff between running processes.
  bool first_pass = false;
};

// Every handoff among `events`, in the order of the stamps (ts_ns), which the events may
// not arrive in: each probe's event is recorded after its trap, and a waiter's trap can end
// before the releaser's. A wait began at its end less the time it waited (value_ns).
std::vector<Handoff> pair_handoffs(std::vector<quanta_handoff_event> events);

}  // namespace quanta::bpf
