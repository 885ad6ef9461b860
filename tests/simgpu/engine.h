// The device engine: one context at a time per device, round-robin time slices among
// contexts with pending work, dead time at each switch between contexts. The timeline
// lives in shared memory and is computed lazily by whoever touches the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tests/simgpu/shared_state.h"

namespace quanta::simgpu {

uint64_t monotonic_ns();

// Device time one process's contexts ran within a window (NVML's per-process utilisation).
struct ProcessBusy {
  int32_t pid;
  uint64_t busy_ns;
  uint64_t window_ns;
};

// How far back per-process utilisation reaches: the buckets kept, less the current one.
inline constexpr uint64_t kUtilWindowNs = (kUtilBuckets - 1) * kUtilBucketNs;

// A point in one context's serial work stream (see ContextSlot).
struct Ticket {
  int device = -1;
  int slot = -1;
  uint64_t generation = 0;
  uint64_t value = 0;
};

class DeviceEngine {
 public:
  DeviceEngine(SharedState* state, int device)
      : state_(state), dev_(state->devices[device]), device_(device) {}

  // Registers a context of this process; returns false when the registry is full.
  bool register_context(int32_t pid, int& slot, uint64_t& generation, uint64_t& context_id);
  void unregister_context(int slot, uint64_t generation);

  // Queues `duration_ns` of work on the context; returns the ticket of its completion.
  Ticket submit(int slot, uint64_t generation, uint64_t duration_ns);
  // Ticket of everything queued so far on the context.
  Ticket tail(int slot, uint64_t generation);

  bool is_complete(const Ticket& t);
  // Blocks until the ticket is complete. Sleeps to the predicted completion by absolute
  // deadline; the device's time never depends on when this thread wakes.
  void wait(const Ticket& t);
  // Device time at which the ticket completed; false if not complete or forgotten.
  bool completion_time(const Ticket& t, uint64_t& time_ns);

  // Utilisation bookkeeping for NVML: total busy device time, advanced to now.
  uint64_t busy_ns();
  // Percent of the last second (of device time) the engine ran work.
  unsigned utilization_percent();
  // Per process with a context on the device or busy in the window, the device time it
  // ran from max(since_ns, now - kUtilWindowNs) to now. Writes at most `capacity` rows;
  // returns how many there are.
  size_t process_utilization(uint64_t since_ns, uint64_t now, ProcessBusy* out, size_t capacity);

 private:
  // Under the device lock: computes the timeline up to `now`.
  void advance(uint64_t now);
  int pick_next() const;
  void account_busy(uint64_t from, uint64_t to);
  void end_slice(uint64_t end);
  void log_slice(int slot, uint64_t start, uint64_t end);
  bool complete_locked(const Ticket& t) const;
  // Earliest time the ticket can complete; `exact` when that is its completion time.
  uint64_t predict_locked(const Ticket& t, uint64_t now, bool& exact) const;

  SharedState* state_;
  DeviceState& dev_;
  int device_;
};

}  // namespace quanta::simgpu
