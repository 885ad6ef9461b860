// Measuring a context's cost: the child's CUDA and NVML calls (both through dlopen, the
// driver's own libraries), and the arbiter's side that runs one child per GPU model.
#include "arbiter/context_overhead.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "arbiter/loop/event_loop.h"
#include "common/clock.h"
#include "common/nvml_api.h"
#include "hosted/nvml.h"

extern char** environ;

namespace quanta::arbiter {
namespace {

// The driver API calls the child makes, with the driver's C ABI (CUresult is an int,
// CUdevice an int, CUcontext a pointer).
using CuInit = int (*)(unsigned);
using CuDeviceGet = int (*)(int*, int);
using CuPrimaryCtxRetain = int (*)(void**, int);
using CuCtxSetCurrent = int (*)(void*);
using CuCtxSynchronize = int (*)();

template <typename F>
F symbol(void* lib, const char* name) {
  return lib == nullptr ? nullptr : reinterpret_cast<F>(dlsym(lib, name));
}

int fail(const std::string& why) {
  std::fprintf(stderr, "%s\n", why.c_str());
  return 1;
}

// This process's usedGpuMemory on `uuid` by NVML's count; false (and `why`) when NVML
// does not list it.
bool own_usage(const std::string& uuid, uint64_t* bytes, std::string* why) {
  const hosted::Nvml& nvml = hosted::nvml();
  const auto init = nvml.init;
  const auto by_uuid = nvml.handle_by_uuid;
  const auto list_v3 = nvml.processes_v3;
  if (init == nullptr || by_uuid == nullptr || list_v3 == nullptr) {
    *why = "libnvidia-ml.so.1 is missing or lacks nvmlDeviceGetComputeRunningProcesses_v3";
    return false;
  }
  nvmlDevice_t dev = nullptr;
  if (init() != NVML_SUCCESS || by_uuid(uuid.c_str(), &dev) != NVML_SUCCESS) {
    *why = "NVML does not find " + uuid;
    return false;
  }
  nvmlProcessInfo_t infos[256];
  unsigned n = 256;
  if (nvmlReturn_t rc = list_v3(dev, &n, infos); rc != NVML_SUCCESS) {
    *why = "NVML cannot list the processes on " + uuid + " (error " + std::to_string(rc) + ")";
    return false;
  }
  for (unsigned i = 0; i < n; ++i) {
    if (infos[i].pid != static_cast<unsigned>(getpid())) continue;
    if (infos[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE) {
      *why = "NVML does not count per-process memory on " + uuid;
      return false;
    }
    *bytes = infos[i].usedGpuMemory;
    return true;
  }
  *why = "NVML does not list this process on " + uuid +
         " (the arbiter needs the host's pid namespace: hostPID)";
  return false;
}

// Runs the child for `gpu`; its bytes, or throws with what it said.
uint64_t run_child(const GpuInfo& gpu, int timeout_ms) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  UniqueFd out_read(out[0]), out_write(out[1]), err_read(err[0]), err_write(err[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0 &&
        std::strncmp(*e, "LD_PRELOAD=", 11) != 0)
      env_text.emplace_back(*e);
  }
  env_text.push_back("CUDA_VISIBLE_DEVICES=" + gpu.uuid);
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", flag = "--measure-context-overhead", uuid = gpu.uuid;
  char* argv[] = {self.data(), flag.data(), uuid.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw std::runtime_error(std::string("cannot start the measurement: ") + std::strerror(rc));
  out_write.reset();
  err_write.reset();
  std::string said[2];
  pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
  const uint64_t deadline =
      common::monotonic_ns() + static_cast<uint64_t>(timeout_ms) * common::kNsPerMs;
  bool timed_out = false;
  for (int open = 2; open > 0;) {
    const uint64_t now = common::monotonic_ns();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>((deadline - now) / common::kNsPerMs) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[512];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0 && said[i].size() < 4096) said[i].append(buffer, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) throw std::runtime_error("took longer than " + std::to_string(timeout_ms) + " ms");
  auto trimmed = [](std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  };
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string why = trimmed(said[1]);
    throw std::runtime_error(
        why.empty() ? "the measurement failed (status " + std::to_string(status) + ")" : why);
  }
  const std::string text = trimmed(said[0]);
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error("the measurement printed \"" + text + "\", not a byte count");
  return std::stoull(text);
}

}  // namespace

int measure_context_overhead_here(const std::string& uuid) {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto init = symbol<CuInit>(cuda, "cuInit");
  auto device_get = symbol<CuDeviceGet>(cuda, "cuDeviceGet");
  auto retain = symbol<CuPrimaryCtxRetain>(cuda, "cuDevicePrimaryCtxRetain");
  auto set_current = symbol<CuCtxSetCurrent>(cuda, "cuCtxSetCurrent");
  auto synchronize = symbol<CuCtxSynchronize>(cuda, "cuCtxSynchronize");
  if (init == nullptr || device_get == nullptr || retain == nullptr || set_current == nullptr ||
      synchronize == nullptr)
    return fail("libcuda.so.1 is missing or lacks the context calls");
  int dev = 0;
  void* context = nullptr;
  if (int rc = init(0); rc != 0) return fail("cuInit failed (CUresult " + std::to_string(rc) + ")");
  if (int rc = device_get(&dev, 0); rc != 0)
    return fail("no device visible as " + uuid + " (CUresult " + std::to_string(rc) + ")");
  if (int rc = retain(&context, dev); rc != 0)
    return fail("cannot create a context on " + uuid + " (CUresult " + std::to_string(rc) + ")");
  if (set_current(context) != 0 || synchronize() != 0)
    return fail("the context on " + uuid + " does not work");
  uint64_t bytes = 0;
  std::string why;
  if (!own_usage(uuid, &bytes, &why)) return fail(why);
  std::printf("%llu\n", static_cast<unsigned long long>(bytes));
  return 0;  // the context goes with the process
}

ContextOverheads measure_context_overheads(const std::vector<GpuInfo>& gpus, int timeout_ms) {
  ContextOverheads out;
  std::map<std::string, const GpuInfo*> by_model;
  for (const GpuInfo& g : gpus) by_model.emplace(g.model.empty() ? g.uuid : g.model, &g);
  uint64_t largest = 0;
  for (const auto& [model, gpu] : by_model) {
    try {
      const uint64_t bytes = run_child(*gpu, timeout_ms);
      out.bytes_by_model[model] = bytes;
      largest = std::max(largest, bytes);
    } catch (const std::exception& e) {
      out.errors.push_back(model + " (" + gpu->uuid + "): " + e.what());
    }
  }
  // A model that could not be measured may cost more than those that could.
  if (!out.bytes_by_model.empty())
    out.charge = out.errors.empty() ? largest : std::max(largest, kFallbackContextOverhead);
  return out;
}

}  // namespace quanta::arbiter
