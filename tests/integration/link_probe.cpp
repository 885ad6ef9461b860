// A small CUDA driver program for what quanta-tenant does not do: many threads whose first
// CUDA calls race the shim's first connection to the arbiter ("threads"), and a linked
// process that forks ("fork"). Prints one JSON object; the test judges it.
#include <cuda.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
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
      if (readlink(path.c_str(), link, sizeof link - 1) > 0 && std::strncmp(link, "socket:", 7) == 0) ++sockets;
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
        if (result == CUDA_SUCCESS) successes.fetch_add(1);
        else if (result == CUDA_ERROR_OUT_OF_MEMORY) denials.fetch_add(1);
        else errors.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::printf("{\"successes\": %d, \"oom\": %d, \"errors\": %d}\n", successes.load(), denials.load(), errors.load());
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
    std::printf("{\"role\": \"child\", \"threads_after_fork\": %d, \"sockets_after_fork\": %d, \"alloc\": %d, "
                "\"threads\": %d, \"sockets\": %d, \"pid\": %d}\n",
                threads_after_fork, sockets_after_fork, static_cast<int>(child_alloc), count_threads(), count_sockets(),
                static_cast<int>(getpid()));
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const CUresult parent_again = cuMemAlloc(&pointer, kBytes);
  std::printf("{\"role\": \"parent\", \"alloc\": %d, \"threads\": %d, \"sockets\": %d, \"child_exit\": %d, "
              "\"alloc_after_child\": %d}\n",
              static_cast<int>(parent_alloc), parent_threads, parent_sockets,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, static_cast<int>(parent_again));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS || cuCtxSetCurrent(context) != CUDA_SUCCESS) {
    std::fprintf(stderr, "link_probe: no CUDA device\n");
    return 1;
  }
  if (mode == "threads") return run_threads(context);
  if (mode == "fork") return run_fork();
  std::fprintf(stderr, "usage: link_probe threads|fork\n");
  return 2;
}
