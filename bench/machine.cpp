// Machine description and real-GPU detection.
#include "bench/machine.h"

#include "bench/process.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace quanta::bench {

namespace {

using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetName = int (*)(char*, int, int);
using CuDriverGetVersion = int (*)(int*);

// Runs in the forked child: prints "count|version|name" on fd, exits 0 on success.
[[noreturn]] void probe_driver(int fd, const std::string& sim_dir) {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) _exit(1);
  link_map* map = nullptr;
  if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    std::error_code error;
    auto loaded = std::filesystem::canonical(map->l_name, error).parent_path();
    auto sim = std::filesystem::canonical(sim_dir, error);
    if (!error && loaded == sim) _exit(2);
  }
  auto init = reinterpret_cast<CuInit>(dlsym(library, "cuInit"));
  auto get_count = reinterpret_cast<CuDeviceGetCount>(dlsym(library, "cuDeviceGetCount"));
  auto get_device = reinterpret_cast<CuDeviceGet>(dlsym(library, "cuDeviceGet"));
  auto get_name = reinterpret_cast<CuDeviceGetName>(dlsym(library, "cuDeviceGetName"));
  auto get_version = reinterpret_cast<CuDriverGetVersion>(dlsym(library, "cuDriverGetVersion"));
  // A library exporting simgpu's own entry point is simgpu wherever it was found.
  if (dlsym(library, "simgpu_version") != nullptr) _exit(2);
  if (init == nullptr || get_count == nullptr || get_device == nullptr || get_name == nullptr) _exit(3);
  if (init(0) != 0) _exit(4);
  int count = 0;
  if (get_count(&count) != 0 || count <= 0) _exit(5);
  int device = 0;
  char name[256] = {};
  if (get_device(&device, 0) != 0 || get_name(name, sizeof(name) - 1, device) != 0) _exit(6);
  int version = 0;
  if (get_version != nullptr) get_version(&version);
  std::string line = std::to_string(count) + "|" + std::to_string(version) + "|" + name;
  if (write(fd, line.data(), line.size()) < 0) _exit(7);
  _exit(0);
}

}  // namespace

std::optional<RealGpu> detect_real_gpu(const std::string& sim_dir) {
  int fds[2];
  if (pipe(fds) != 0) return std::nullopt;
  pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::nullopt;
  }
  if (child == 0) {
    close(fds[0]);
    probe_driver(fds[1], sim_dir);
  }
  close(fds[1]);
  // cuInit on a real GPU can take seconds (persistence mode off); give it 20.
  int raw = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pid_t done = 0;
  while ((done = waitpid(child, &raw, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &raw, 0);
  }
  char buffer[512] = {};
  ssize_t got = read(fds[0], buffer, sizeof(buffer) - 1);
  close(fds[0]);
  if (done != child || !WIFEXITED(raw) || WEXITSTATUS(raw) != 0 || got <= 0) return std::nullopt;
  std::string text(buffer, static_cast<size_t>(got));
  auto first = text.find('|');
  auto second = text.find('|', first + 1);
  if (first == std::string::npos || second == std::string::npos) return std::nullopt;
  RealGpu gpu;
  gpu.count = std::stoi(text.substr(0, first));
  gpu.driver_version = std::stoi(text.substr(first + 1, second - first - 1));
  gpu.name = text.substr(second + 1);
  return gpu;
}

nlohmann::json describe_machine(const std::optional<RealGpu>& gpu) {
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  utsname names{};
  uname(&names);
  double load = 0;
  std::ifstream loadavg("/proc/loadavg");
  loadavg >> load;
  nlohmann::json machine = {{"cpu", cpu},
                            {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
                            {"kernel", names.release},
                            {"load_avg_1m", load}};
  if (gpu) {
    machine["gpu"] = gpu->name;
    machine["gpu_count"] = gpu->count;
    machine["driver_version"] = gpu->driver_version;
  } else {
    machine["gpu"] = "simgpu";
  }
  return machine;
}

}  // namespace quanta::bench
