// Which GPU each process uses, from NVML's per-device process lists (dlopen'ed, so a node
// without NVML still traces): the only way to place a process the arbiter does not manage.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>

namespace quanta::bpf {

class NvmlProcesses {
 public:
  NvmlProcesses();  // loads libnvidia-ml.so.1 (hosted/nvml.h) and initialises it; never throws
  ~NvmlProcesses();
  NvmlProcesses(const NvmlProcesses&) = delete;
  NvmlProcesses& operator=(const NvmlProcesses&) = delete;

  bool available() const { return initialised_; }
  const std::string& note() const { return note_; }  // why it is not available
  // Adds what NVML lists now to what was seen before: processes leave, the record stays.
  void refresh();
  const std::map<pid_t, std::set<std::string>>& gpus_by_pid() const { return gpus_; }

 private:
  bool initialised_ = false;
  std::string note_;
  std::map<pid_t, std::set<std::string>> gpus_;
};

}  // namespace quanta::bpf
