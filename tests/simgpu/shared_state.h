// The device model every process on the machine shares: one POSIX shared-memory segment
// (named by SIMGPU_STATE) holding each device's memory ledger, context registry,
// per-process usage and engine timeline, each device behind its own robust mutex.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "tests/simgpu/config.h"

namespace quanta::simgpu {

inline constexpr uint64_t kStateMagic = 0x5155414e54415347ULL;  // "QUANTASG"
inline constexpr uint32_t kStateVersion = 4;
inline constexpr int kMaxDevices = 32;
inline constexpr int kMaxContexts = 128;   // per device, across all processes
inline constexpr int kMaxProcesses = 256;  // per device, for usage and NVML lists
inline constexpr int kMaxAttached = 1024;  // processes attached to the state
inline constexpr int kSliceRing = 32;      // recent slices kept per context
inline constexpr int kUtilBuckets = 10;
inline constexpr uint64_t kUtilBucketNs = 100'000'000;

// One run of a context on the engine: device time `time_start` corresponds to the
// context's executed-work counter `exec_start`, and it ran until `exec_end`.
struct SliceRecord {
  uint64_t time_start;
  uint64_t exec_start;
  uint64_t exec_end;
};

// A context's work is one serial stream of device time: `submitted` is the total
// duration ever queued, `executed` the total the engine has run. An item queued with
// ticket T (the `submitted` value after adding it) is complete once executed >= T.
struct ContextSlot {
  uint32_t live;
  int32_t pid;
  int32_t usage_index;  // its process's entry in DeviceState::processes, -1 when none
  uint64_t context_id;
  uint64_t generation;
  uint64_t submitted;
  uint64_t executed;
  uint32_t ring_next;
  uint32_t ring_count;
  SliceRecord ring[kSliceRing];
};

// Busy device time per 100 ms of device time, for NVML's utilisation over the last second
// (the device's and each process's).
struct UtilBuckets {
  uint64_t id[kUtilBuckets];
  uint64_t busy_ns[kUtilBuckets];
};

struct ProcessUsage {
  int32_t pid;
  uint32_t contexts;
  uint64_t bytes;
  uint64_t busy_ns;  // device time its contexts ran, in all
  UtilBuckets util;  // nvmlDeviceGetProcessUtilization
};

struct Engine {
  uint64_t clock_ns;  // device time has been computed up to here
  int32_t running;    // context slot on the engine, -1 when none
  int32_t last_ran;   // slot that ran last, -1 before any
  uint64_t slice_start_ns;
  uint64_t last_end_ns;  // when the last slice ended
  uint64_t busy_ns;      // total device time spent running work
  uint64_t last_reap_ns;
  UtilBuckets util;  // nvmlDeviceGetUtilizationRates
};

struct DeviceState {
  pthread_mutex_t lock;
  char name[64];
  char uuid_text[48];
  uint8_t uuid[16];
  uint8_t parent_uuid[16];
  int32_t physical_index;
  int32_t mig_instance;
  uint64_t capacity;
  uint64_t used;
  Engine engine;
  ContextSlot contexts[kMaxContexts];
  ProcessUsage processes[kMaxProcesses];
};

struct SharedState {
  uint64_t magic;
  uint32_t version;
  uint32_t device_count;
  uint64_t size;
  std::atomic<uint64_t> next_context_id;
  uint64_t timeslice_ns;
  uint64_t switch_ns;
  char log_path[512];
  int32_t attached[kMaxAttached];
  DeviceState devices[kMaxDevices];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Opens (creating on demand) the segment named by cfg.state_name and registers this
// process. When no live process is attached, the segment is reset to `cfg`, so the first
// process of a run fixes the device shape. Returns nullptr and sets `error` on failure.
SharedState* attach_shared_state(const Config& cfg, std::string& error);

// Removes this process from the attached list (at normal exit).
void detach_shared_state(SharedState* state);

// Locks a device; a lock whose holder died is made consistent and its owner reaped.
class DeviceLock {
 public:
  explicit DeviceLock(DeviceState& dev);
  ~DeviceLock();
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;
  bool owner_died() const { return owner_died_; }

 private:
  DeviceState& dev_;
  bool owner_died_ = false;
};

bool process_alive(int32_t pid);

// Under the device lock: frees the memory and contexts of processes that have died.
void reap_dead_processes(DeviceState& dev);

// Under the device lock: per-process usage bookkeeping.
ProcessUsage* find_process(DeviceState& dev, int32_t pid, bool create);

}  // namespace quanta::simgpu

namespace quanta::simgpu {

// Global capacity accounting: charges `bytes` to device memory and to `pid`'s usage.
// Returns false (nothing charged) when the device's capacity would be exceeded, after
// first reclaiming what dead processes held.
bool reserve_device_memory(DeviceState& dev, int32_t pid, uint64_t bytes);
void release_device_memory(DeviceState& dev, int32_t pid, uint64_t bytes);
// Drops everything `pid` holds on the device (its contexts, queued work and memory).
void forget_process(DeviceState& dev, int32_t pid);

}  // namespace quanta::simgpu
