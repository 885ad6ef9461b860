// What NVML says about the managed GPUs, read on a thread of its own so a slow driver call
// never holds up the event loop: once at start the model, memory and MIG identity of each
// GPU, then every interval the compute processes on it (pid, memory) and each process's
// busy time (nvmlDeviceGetProcessUtilization, integrated into a running total per pid).
// The one reader of NVML's process view: the arbiter reconciles each reading with its
// registry (nvml_reconcile.cpp) when fd() turns readable, and the metrics use the same.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/loop/event_loop.h"  // UniqueFd

namespace quanta::arbiter {

struct GpuIdentity {
  std::string model;          // nvmlDeviceGetName ("" when NVML could not say)
  uint64_t memory_total = 0;  // nvmlDeviceGetMemoryInfo
  bool mig = false;           // a MIG instance
  std::string mig_profile;    // "1g.10gb": what follows " MIG " in the device name
  std::string mig_instance;   // nvmlDeviceGetGpuInstanceId, as text; "" off MIG
};

struct NvmlProcess {
  pid_t pid = 0;
  uint64_t used_bytes = 0;  // usedGpuMemory (0 where NVML cannot say)
};

struct GpuReading {
  bool ok = false;    // the device answered and listed its processes
  std::string error;  // why not, when !ok
  uint64_t at_ns = 0;
  std::vector<NvmlProcess> processes;
  // nvmlDeviceGetProcessUtilization works here (not on MIG instances or old drivers).
  bool process_busy_supported = false;
  std::map<pid_t, uint64_t> busy_ns;  // device time each pid ran since the sampler first saw it
};

class NvmlSampler {
 public:
  // Reads each GPU's identity now; with interval_ns > 0 starts sampling every interval.
  NvmlSampler(const std::vector<std::string>& uuids, uint64_t interval_ns);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  const std::vector<GpuIdentity>& identities() const { return identities_; }
  // The latest readings, one per GPU in the order given (empty before the first sample).
  std::shared_ptr<const std::vector<GpuReading>> latest() const;
  // Readable after each new reading (for EventLoop::add); acknowledge() before latest().
  int fd() const { return ready_.get(); }
  void acknowledge();

 private:
  struct Api;
  void run();
  std::vector<GpuReading> sample();

  std::unique_ptr<Api> api_;
  std::vector<std::string> uuids_;
  std::vector<GpuIdentity> identities_;
  uint64_t interval_ns_;
  // Per GPU: the previous utilisation query (CPU time in us) and the running totals.
  std::vector<unsigned long long> last_seen_us_;
  std::vector<std::map<pid_t, uint64_t>> busy_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::shared_ptr<const std::vector<GpuReading>> latest_;
  UniqueFd ready_;
  std::thread thread_;
};

}  // namespace quanta::arbiter
