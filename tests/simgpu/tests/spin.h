// Test helper: a spin kernel on simgpu (any function named quanta_spin*), launched with
// its duration in nanoseconds as the first parameter, and a reader for the execution log.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace quanta::simgpu::test {

inline CUresult load_spin(CUfunction* fn) {
  CUmodule module = nullptr;
  static const char kImage[] = "simgpu ignores module images";
  if (CUresult r = cuModuleLoadData(&module, kImage); r != CUDA_SUCCESS) return r;
  return cuModuleGetFunction(fn, module, "quanta_spin_ns");
}

inline CUresult launch_spin(CUfunction fn, unsigned long long ns, CUstream stream = nullptr) {
  void* params[] = {&ns};
  return cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
}

inline uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

struct Slice {
  int device = 0;
  uint64_t context = 0;
  int pid = 0;
  uint64_t start = 0;
  uint64_t end = 0;
};

// Parses `slice <device> <context_id> <pid> <start_ns> <end_ns>` lines.
inline std::vector<Slice> read_log(const std::string& path) {
  std::vector<Slice> slices;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tag;
    Slice s;
    if (fields >> tag >> s.device >> s.context >> s.pid >> s.start >> s.end && tag == "slice")
      slices.push_back(s);
  }
  return slices;
}

}  // namespace quanta::simgpu::test
