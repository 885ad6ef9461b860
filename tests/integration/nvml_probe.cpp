// An NVML-only program (what nvidia-smi and exporters are): reads device 0's memory through
// NVML, reports it, and stays alive until GO_FILE exists so a test can look at the arbiter
// meanwhile. Usage: nvml_probe GO_FILE
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/nvml_api.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nvml_probe GO_FILE\n");
    return 2;
  }
  nvmlDevice_t device = nullptr;
  nvmlMemory_t memory{};
  nvmlReturn_t result = nvmlInit_v2();
  if (result == NVML_SUCCESS) result = nvmlDeviceGetHandleByIndex_v2(0, &device);
  if (result == NVML_SUCCESS) result = nvmlDeviceGetMemoryInfo(device, &memory);
  std::printf("{\"result\": %d, \"total\": %llu, \"used\": %llu, \"free\": %llu}\n",
              static_cast<int>(result), memory.total, memory.used, memory.free);
  std::fflush(stdout);
  for (int i = 0; i < 3000 && access(argv[1], F_OK) != 0; ++i) usleep(10 * 1000);
  nvmlShutdown();
  return result == NVML_SUCCESS ? 0 : 1;
}
