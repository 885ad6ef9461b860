// quanta-fault-tenant: the faults quanta-tenant cannot play, for the fault suite. A CUDA
// program linked like an application (libquanta.so interposes when preloaded) that either
// leaves with work still queued on the GPU, or runs batch work while its descriptor table
// is full. One JSON object on stdout says what it did and which CUDA calls failed.
//
//   quanta-fault-tenant inflight KERNEL_MS COUNT
//       launches COUNT kernels of KERNEL_MS and exits at once (exit(0), atexit handlers run)
//   quanta-fault-tenant fds SECONDS FILL_AT RELEASE_AT
//       batch work (2 ms kernels, two in flight) for SECONDS under RLIMIT_NOFILE 256; at
//       FILL_AT seconds (0: before the first CUDA call) every free descriptor is taken, and
//       at RELEASE_AT seconds given back (released_at_ns: CLOCK_MONOTONIC)
#include <cuda.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Which calls failed, by "call:ERROR_NAME".
std::map<std::string, int> g_errors;

bool ok(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(result, &name);
  ++g_errors[std::string(call) + ":" + (name != nullptr ? name : std::to_string(result))];
  return false;
}

std::string errors_json() {
  std::string out = "{";
  for (const auto& [call, count] : g_errors) {
    out += (out.size() > 1 ? "," : "") + std::string("\"") + call + "\":" + std::to_string(count);
  }
  return out + "}";
}

// The spin kernel: simgpu never reads the image, and any quanta_spin* function lasts its
// first parameter in nanoseconds.
constexpr char kImage[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry quanta_spin(.param .u64 d) { ret; }\n";

struct Gpu {
  CUcontext context = nullptr;
  CUfunction spin = nullptr;
  CUstream stream = nullptr;
};

bool open_gpu(Gpu* gpu) {
  CUdevice device = 0;
  CUmodule module = nullptr;
  return ok(cuInit(0), "cuInit") && ok(cuDeviceGet(&device, 0), "cuDeviceGet") &&
         ok(cuDevicePrimaryCtxRetain(&gpu->context, device), "cuDevicePrimaryCtxRetain") &&
         ok(cuCtxSetCurrent(gpu->context), "cuCtxSetCurrent") &&
         ok(cuModuleLoadData(&module, kImage), "cuModuleLoadData") &&
         ok(cuModuleGetFunction(&gpu->spin, module, "quanta_spin"), "cuModuleGetFunction") &&
         ok(cuStreamCreate(&gpu->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

bool launch(const Gpu& gpu, double kernel_ms) {
  unsigned long long duration_ns = static_cast<unsigned long long>(kernel_ms * 1e6);
  void* params[] = {&duration_ns};
  return ok(cuLaunchKernel(gpu.spin, 1, 1, 1, 1, 1, 1, 0, gpu.stream, params, nullptr),
            "cuLaunchKernel");
}

// Takes every free descriptor (up to the soft limit); returns them.
std::vector<int> fill_descriptors() {
  std::vector<int> taken;
  for (;;) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    taken.push_back(fd);
  }
  return taken;
}

int run_inflight(double kernel_ms, int count) {
  Gpu gpu;
  if (!open_gpu(&gpu)) {
    std::printf("{\"mode\":\"inflight\",\"ok\":false,\"errors\":%s}\n", errors_json().c_str());
    return 1;
  }
  int launched = 0;
  for (int i = 0; i < count; ++i) launched += launch(gpu, kernel_ms) ? 1 : 0;
  CUresult query = cuStreamQuery(gpu.stream);
  std::printf(
      "{\"mode\":\"inflight\",\"ok\":%s,\"launched\":%d,\"pending_at_exit\":%s,\"errors\":%s}\n",
      g_errors.empty() ? "true" : "false", launched,
      query == CUDA_ERROR_NOT_READY ? "true" : "false", errors_json().c_str());
  std::fflush(stdout);
  std::exit(0);  // with the kernels still queued
}

int run_fds(double seconds, double fill_at, double release_at) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 256);
  setrlimit(RLIMIT_NOFILE, &limit);
  std::vector<int> taken;
  size_t most_taken = 0;
  uint64_t released_at_ns = 0;
  if (fill_at <= 0) taken = fill_descriptors();
  most_taken = taken.size();
  const double start = now_s();
  Gpu gpu;
  long kernels = 0;
  bool opened = open_gpu(&gpu);
  if (opened) {
    CUevent done[2] = {nullptr, nullptr};
    ok(cuEventCreate(&done[0], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    ok(cuEventCreate(&done[1], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    bool filled = fill_at <= 0;
    bool released = false;
    for (long i = 0; now_s() - start < seconds; ++i) {
      const double t = now_s() - start;
      if (!filled && t >= fill_at) {
        taken = fill_descriptors();
        most_taken = std::max(most_taken, taken.size());
        filled = true;
      }
      if (!released && t >= release_at) {
        for (int fd : taken) close(fd);
        taken.clear();
        released = true;
        released_at_ns = monotonic_ns();
      }
      CUevent& slot = done[i % 2];
      if (i >= 2 && !ok(cuEventSynchronize(slot), "cuEventSynchronize")) break;
      if (i >= 2) ++kernels;
      if (!launch(gpu, 2.0) || !ok(cuEventRecord(slot, gpu.stream), "cuEventRecord")) break;
    }
    ok(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
    CUdeviceptr p = 0;
    if (ok(cuMemAlloc(&p, 1 << 20), "cuMemAlloc")) ok(cuMemFree(p), "cuMemFree");
  }
  for (int fd : taken) close(fd);
  std::printf(
      "{\"mode\":\"fds\",\"ok\":%s,\"kernels\":%ld,\"descriptors_taken\":%zu,"
      "\"released_at_ns\":%llu,\"errors\":%s}\n",
      opened && g_errors.empty() ? "true" : "false", kernels, most_taken,
      static_cast<unsigned long long>(released_at_ns), errors_json().c_str());
  return opened && g_errors.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "inflight" && argc == 4) return run_inflight(std::atof(argv[2]), std::atoi(argv[3]));
  if (mode == "fds" && argc == 5)
    return run_fds(std::atof(argv[2]), std::atof(argv[3]), std::atof(argv[4]));
  std::fprintf(stderr,
               "usage: quanta-fault-tenant inflight KERNEL_MS COUNT | fds SECONDS FILL_AT "
               "RELEASE_AT\n");
  return 2;
}
