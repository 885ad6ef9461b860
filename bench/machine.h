// The machine a run measured: CPU model, cores, kernel, load, and the GPU (a real NVIDIA
// device found by loading libcuda.so.1 in a child process, or simgpu).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace quanta::bench {

struct RealGpu {
  std::string name;
  int count = 0;
  int driver_version = 0;
};

// Loads libcuda.so.1 and calls cuInit in a child (so this process keeps no driver state);
// a library that resolves into `sim_dir` is simgpu, not a GPU. Empty when none works.
std::optional<RealGpu> detect_real_gpu(const std::string& sim_dir);

// {"cpu": "...", "cores": 2, "kernel": "6.1.0", "gpu": "simgpu" | "NVIDIA H100 …",
//  "load_avg_1m": 1.2}
nlohmann::json describe_machine(const std::optional<RealGpu>& gpu);

}  // namespace quanta::bench
