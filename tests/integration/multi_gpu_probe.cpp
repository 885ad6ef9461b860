// A CUDA driver program using two GPUs from one process, for what quanta-tenant does not do:
// one thread per GPU keeping kernels of its own length queued ("threads"), or cooperative
// multi-device launches on both GPUs at once ("coop"). Prints one JSON object with what it
// completed; the tests judge the GPU time it got from simgpu's log.
//
//   multi_gpu_probe threads SECONDS KERNEL0_MS KERNEL1_MS
//   multi_gpu_probe coop SECONDS KERNEL_MS
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

struct Device {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  CUfunction spin = nullptr;
};

bool open_device(int ordinal, Device* out) {
  CUdevice device = 0;
  if (cuDeviceGet(&device, ordinal) != CUDA_SUCCESS) return false;
  if (cuDevicePrimaryCtxRetain(&out->context, device) != CUDA_SUCCESS) return false;
  if (cuCtxSetCurrent(out->context) != CUDA_SUCCESS) return false;
  CUmodule module = nullptr;
  static const char kImage[] = "simgpu ignores module images";
  return cuModuleLoadData(&module, kImage) == CUDA_SUCCESS &&
         cuModuleGetFunction(&out->spin, module, "quanta_spin_ns") == CUDA_SUCCESS &&
         cuStreamCreate(&out->stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Keeps two kernels queued on one device until the deadline (waits on the older one).
int keep_busy(const Device& device, double seconds, double kernel_ms, long* completed) {
  if (cuCtxSetCurrent(device.context) != CUDA_SUCCESS) return 1;
  unsigned long long ns = static_cast<unsigned long long>(kernel_ms * 1e6);
  void* params[] = {&ns};
  CUevent events[2] = {};
  for (CUevent& event : events) {
    if (cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  long launched = 0;
  while (seconds_since(start) < seconds) {
    CUevent& slot = events[launched % 2];
    if (launched >= 2 && cuEventSynchronize(slot) != CUDA_SUCCESS) return 1;
    if (launched >= 2) ++*completed;
    if (cuLaunchKernel(device.spin, 1, 1, 1, 1, 1, 1, 0, device.stream, params, nullptr) !=
            CUDA_SUCCESS ||
        cuEventRecord(slot, device.stream) != CUDA_SUCCESS)
      return 1;
    ++launched;
  }
  if (cuStreamSynchronize(device.stream) != CUDA_SUCCESS) return 1;
  *completed += launched >= 2 ? 2 : launched;
  return 0;
}

int run_threads(Device (&devices)[2], double seconds, double kernel0_ms, double kernel1_ms) {
  long completed[2] = {0, 0};
  int failed[2] = {0, 0};
  std::thread first([&] { failed[0] = keep_busy(devices[0], seconds, kernel0_ms, &completed[0]); });
  std::thread second(
      [&] { failed[1] = keep_busy(devices[1], seconds, kernel1_ms, &completed[1]); });
  first.join();
  second.join();
  std::printf("{\"ok\": %s, \"kernels\": [%ld, %ld]}\n", failed[0] || failed[1] ? "false" : "true",
              completed[0], completed[1]);
  return failed[0] || failed[1] ? 1 : 0;
}

int run_coop(Device (&devices)[2], double seconds, double kernel_ms) {
  unsigned long long ns = static_cast<unsigned long long>(kernel_ms * 1e6);
  void* params[] = {&ns};
  CUDA_LAUNCH_PARAMS launches[2] = {};
  for (int i = 0; i < 2; ++i) {
    launches[i].function = devices[i].spin;
    launches[i].gridDimX = launches[i].gridDimY = launches[i].gridDimZ = 1;
    launches[i].blockDimX = launches[i].blockDimY = launches[i].blockDimZ = 1;
    launches[i].hStream = devices[i].stream;
    launches[i].kernelParams = params;
  }
  const auto start = std::chrono::steady_clock::now();
  long completed = 0;
  while (seconds_since(start) < seconds) {
    // Deprecated since CUDA 11.3, and still exported and gated: programs keep calling it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    const CUresult launched = cuLaunchCooperativeKernelMultiDevice(launches, 2, 0);
#pragma GCC diagnostic pop
    if (launched != CUDA_SUCCESS) {
      std::printf("{\"ok\": false, \"launch\": %d}\n", static_cast<int>(launched));
      return 1;
    }
    for (const Device& device : devices) {
      if (cuStreamSynchronize(device.stream) != CUDA_SUCCESS) return 1;
    }
    ++completed;
  }
  std::printf("{\"ok\": true, \"launches\": %ld}\n", completed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: multi_gpu_probe threads SECONDS K0_MS K1_MS | coop SECONDS K_MS\n");
    return 2;
  }
  const std::string mode = argv[1];
  Device devices[2];
  if (cuInit(0) != CUDA_SUCCESS || !open_device(0, &devices[0]) || !open_device(1, &devices[1])) {
    std::printf("{\"ok\": false, \"error\": \"two devices are needed\"}\n");
    return 1;
  }
  if (mode == "threads" && argc == 5)
    return run_threads(devices, std::atof(argv[2]), std::atof(argv[3]), std::atof(argv[4]));
  if (mode == "coop" && argc == 4) return run_coop(devices, std::atof(argv[2]), std::atof(argv[3]));
  std::fprintf(stderr, "multi_gpu_probe: unknown mode or arguments: %s\n", argv[1]);
  return 2;
}
