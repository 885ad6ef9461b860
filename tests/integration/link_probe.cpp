// A small CUDA driver program for what quanta-tenant does not do: many threads whose first
// CUDA calls race the shim's first connection to the arbiter ("threads"), a linked process
// that forks ("fork"), a process that starts before the arbiter and waits to be told it
// joined ("join"), one that retries until it is allowed CUDA ("deny"), one that takes over
// the shim's descriptor numbers for files of its own ("fds"), and managed memory held until
// told to stop ("managed"). Prints one JSON object; the test judges it.
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int count_threads() {
  int threads = 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (dirent* e = readdir(tasks)) threads += e->d_name[0] != '.';
    closedir(tasks);
  }
  return threads;
}

int count_sockets() {
  int sockets = 0;
  if (DIR* fds = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(fds)) {
      if (e->d_name[0] == '.') continue;
      char link[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(path.c_str(), link, sizeof link - 1) > 0 &&
          std::strncmp(link, "socket:", 7) == 0)
        ++sockets;
    }
    closedir(fds);
  }
  return sockets;
}

constexpr size_t kBytes = 16u << 20;

int run_threads(CUcontext context) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 4;
  std::atomic<int> ready{0}, successes{0}, denials{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      cuCtxSetCurrent(context);
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int i = 0; i < kPerThread; ++i) {
        CUdeviceptr pointer = 0;
        const CUresult result = cuMemAlloc(&pointer, kBytes);
        if (result == CUDA_SUCCESS)
          successes.fetch_add(1);
        else if (result == CUDA_ERROR_OUT_OF_MEMORY)
          denials.fetch_add(1);
        else
          errors.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::printf("{\"successes\": %d, \"oom\": %d, \"errors\": %d}\n", successes.load(),
              denials.load(), errors.load());
  return 0;
}

int run_fork() {
  CUdeviceptr pointer = 0;
  const CUresult parent_alloc = cuMemAlloc(&pointer, kBytes);
  const int parent_threads = count_threads();
  const int parent_sockets = count_sockets();
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    const int threads_after_fork = count_threads();
    const int sockets_after_fork = count_sockets();
    // A forked child starts CUDA afresh, as the driver requires; its first use links it anew.
    CUdevice device = 0;
    CUcontext context = nullptr;
    CUresult child_alloc = cuInit(0);
    if (child_alloc == CUDA_SUCCESS) child_alloc = cuDeviceGet(&device, 0);
    if (child_alloc == CUDA_SUCCESS) child_alloc = cuDevicePrimaryCtxRetain(&context, device);
    if (child_alloc == CUDA_SUCCESS) child_alloc = cuCtxSetCurrent(context);
    CUdeviceptr mine = 0;
    if (child_alloc == CUDA_SUCCESS) child_alloc = cuMemAlloc(&mine, kBytes);
    usleep(100 * 1000);
    std::printf(
        "{\"role\": \"child\", \"threads_after_fork\": %d, \"sockets_after_fork\": %d, \"alloc\": "
        "%d, "
        "\"threads\": %d, \"sockets\": %d, \"pid\": %d}\n",
        threads_after_fork, sockets_after_fork, static_cast<int>(child_alloc), count_threads(),
        count_sockets(), static_cast<int>(getpid()));
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const CUresult parent_again = cuMemAlloc(&pointer, kBytes);
  std::printf(
      "{\"role\": \"parent\", \"alloc\": %d, \"threads\": %d, \"sockets\": %d, \"child_exit\": %d, "
      "\"alloc_after_child\": %d}\n",
      static_cast<int>(parent_alloc), parent_threads, parent_sockets,
      WIFEXITED(status) ? WEXITSTATUS(status) : -1, static_cast<int>(parent_again));
  return 0;
}

// Blocks until `path` exists (the test creates it) or `timeout_s` passes.
bool wait_for_file(const std::string& path, double timeout_s) {
  for (double waited = 0; waited < timeout_s; waited += 0.01) {
    if (access(path.c_str(), F_OK) == 0) return true;
    usleep(10 * 1000);
  }
  return false;
}

CUfunction spin_function() {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  static const char kImage[] = "simgpu ignores module images";
  if (cuModuleLoadData(&module, kImage) != CUDA_SUCCESS ||
      cuModuleGetFunction(&function, module, "quanta_spin_ns") != CUDA_SUCCESS)
    return nullptr;
  return function;
}

CUresult launch_spin(CUfunction function, unsigned long long ns) {
  void* params[] = {&ns};
  return cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
}

// join BEFORE AFTER GO_FILE: holds BEFORE bytes allocated while no arbiter is there, then,
// once GO_FILE exists (the test saw it admitted), tries AFTER bytes, frees BEFORE and tries
// AFTER again.
int run_join(size_t before, size_t after, const std::string& go) {
  CUdeviceptr held = 0, first = 0, second = 0;
  const CUresult before_alloc = cuMemAlloc(&held, before);
  const bool told = wait_for_file(go, 30);
  const CUresult after_alloc = cuMemAlloc(&first, after);
  if (after_alloc == CUDA_SUCCESS) cuMemFree(first);
  const CUresult free_before = cuMemFree(held);
  const CUresult after_free = cuMemAlloc(&second, after);
  if (after_free == CUDA_SUCCESS) cuMemFree(second);
  std::printf(
      "{\"before\": %d, \"told\": %s, \"after\": %d, \"free_before\": %d, \"after_free\": %d}\n",
      static_cast<int>(before_alloc), told ? "true" : "false", static_cast<int>(after_alloc),
      static_cast<int>(free_before), static_cast<int>(after_free));
  return 0;
}

// deny TIMEOUT_S: retries the primary context until it is allowed, then allocates and
// launches; reports the first answer and how many refusals came before success.
int run_deny(double timeout_s) {
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS) return 1;
  CUresult first = CUDA_SUCCESS, last = CUDA_SUCCESS;
  int refusals = 0;
  for (double waited = 0;; waited += 0.05) {
    last = cuDevicePrimaryCtxRetain(&context, device);
    if (refusals == 0) first = last;
    if (last == CUDA_SUCCESS || waited > timeout_s) break;
    ++refusals;
    usleep(50 * 1000);
  }
  CUresult alloc = CUDA_ERROR_UNKNOWN, launch = CUDA_ERROR_UNKNOWN;
  if (last == CUDA_SUCCESS) {
    cuCtxSetCurrent(context);
    CUdeviceptr pointer = 0;
    alloc = cuMemAlloc(&pointer, kBytes);
    if (alloc == CUDA_SUCCESS) cuMemFree(pointer);
    CUfunction spin = spin_function();
    launch = spin ? launch_spin(spin, 1000) : CUDA_ERROR_NOT_FOUND;
    cuCtxSynchronize();
  }
  std::printf("{\"first\": %d, \"refusals\": %d, \"last\": %d, \"alloc\": %d, \"launch\": %d}\n",
              static_cast<int>(first), refusals, static_cast<int>(last), static_cast<int>(alloc),
              static_cast<int>(launch));
  return 0;
}

// revoked GO_FILE: linked and working; once GO_FILE exists (the arbiter now refuses it),
// keeps trying an allocation and a launch for up to 5 s and reports what they returned.
int run_revoked(CUcontext, const std::string& go) {
  CUfunction spin = spin_function();
  CUdeviceptr pointer = 0;
  const CUresult before = cuMemAlloc(&pointer, kBytes);
  if (before == CUDA_SUCCESS) cuMemFree(pointer);
  const CUresult launch_before = spin ? launch_spin(spin, 1000) : CUDA_ERROR_NOT_FOUND;
  cuCtxSynchronize();
  wait_for_file(go, 30);
  CUresult alloc = CUDA_SUCCESS, launch = CUDA_SUCCESS;
  for (int i = 0; i < 100 && (alloc == CUDA_SUCCESS || launch == CUDA_SUCCESS); ++i) {
    alloc = cuMemAlloc(&pointer, kBytes);
    if (alloc == CUDA_SUCCESS) cuMemFree(pointer);
    launch = spin ? launch_spin(spin, 1000) : CUDA_ERROR_NOT_FOUND;
    usleep(50 * 1000);
  }
  std::printf("{\"before\": %d, \"launch_before\": %d, \"alloc\": %d, \"launch\": %d}\n",
              static_cast<int>(before), static_cast<int>(launch_before), static_cast<int>(alloc),
              static_cast<int>(launch));
  return 0;
}

bool is_shim_descriptor(int fd) {
  char link[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (readlink(path.c_str(), link, sizeof link - 1) <= 0) return false;
  return std::strncmp(link, "socket:", 7) == 0 || std::strstr(link, "eventfd") != nullptr;
}

// fds FILE: linked; then every socket and eventfd descriptor (the shim's) is closed and
// FILE (holding "app data") put under that number, as a program that closes descriptors it
// does not know and reuses the numbers would; then 1 s of ordinary work. Reports whether
// the program's descriptors still name its file and whether the file was written to.
int run_fds(const std::string& file) {
  CUfunction spin = spin_function();
  CUdeviceptr pointer = 0;
  const CUresult linked = cuMemAlloc(&pointer, kBytes);
  if (linked == CUDA_SUCCESS) cuMemFree(pointer);
  std::vector<int> taken;
  int lowest = 1 << 30;
  for (int fd = 3; fd < 4096; ++fd) {
    if (!is_shim_descriptor(fd)) continue;
    taken.push_back(fd);
    lowest = std::min(lowest, fd);
  }
  const int data = open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (data < 0 || write(data, "app data", 8) != 8) return 1;
  struct stat mine {};
  fstat(data, &mine);
  for (int fd : taken) {
    close(fd);
    dup2(data, fd);
  }
  int errors = 0;
  for (int i = 0; i < 100; ++i) {
    if (cuMemAlloc(&pointer, kBytes) != CUDA_SUCCESS || cuMemFree(pointer) != CUDA_SUCCESS)
      ++errors;
    if (spin && launch_spin(spin, 1000) != CUDA_SUCCESS) ++errors;
    cuCtxSynchronize();
    usleep(10 * 1000);
  }
  bool intact = true;
  for (int fd : taken) {
    struct stat now {};
    intact =
        intact && fstat(fd, &now) == 0 && now.st_ino == mine.st_ino && now.st_dev == mine.st_dev;
  }
  struct stat after {};
  fstat(data, &after);
  std::printf(
      "{\"linked\": %d, \"taken\": %zu, \"lowest\": %d, \"intact\": %s, \"size\": %lld, "
      "\"errors\": %d}\n",
      static_cast<int>(linked), taken.size(), taken.empty() ? -1 : lowest,
      intact ? "true" : "false", static_cast<long long>(after.st_size), errors);
  return 0;
}

// managed BYTES GO_FILE: a managed allocation held until GO_FILE exists.
int run_managed(size_t bytes, const std::string& go) {
  CUdeviceptr pointer = 0;
  const CUresult managed = cuMemAllocManaged(&pointer, bytes, CU_MEM_ATTACH_GLOBAL);
  const bool told = wait_for_file(go, 30);
  if (managed == CUDA_SUCCESS) cuMemFree(pointer);
  std::printf("{\"managed\": %d, \"told\": %s}\n", static_cast<int>(managed),
              told ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "deny") return run_deny(argc > 2 ? std::atof(argv[2]) : 10);
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
      cuCtxSetCurrent(context) != CUDA_SUCCESS) {
    std::fprintf(stderr, "link_probe: no CUDA device\n");
    return 1;
  }
  if (mode == "threads") return run_threads(context);
  if (mode == "fork") return run_fork();
  if (mode == "join" && argc == 5)
    return run_join(std::strtoull(argv[2], nullptr, 0), std::strtoull(argv[3], nullptr, 0),
                    argv[4]);
  if (mode == "revoked" && argc == 3) return run_revoked(context, argv[2]);
  if (mode == "fds" && argc == 3) return run_fds(argv[2]);
  if (mode == "managed" && argc == 4)
    return run_managed(std::strtoull(argv[2], nullptr, 0), argv[3]);
  std::fprintf(stderr,
               "usage: link_probe threads|fork|deny [S]|join BEFORE AFTER GO|revoked GO|fds "
               "FILE|managed BYTES GO\n");
  return 2;
}
