// A program that never calls CUDA, run with libquanta.so preloaded: it reports how many
// threads and sockets it has after a while, and whether the shim is mapped at all, so a
// test can prove that merely loading the shim costs a process no connection and no thread.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

int main() {
  // Symbol lookups the shim interposes (dlsym) must not wake the link either.
  void* entry = dlsym(RTLD_DEFAULT, "getpid");
  usleep(200 * 1000);
  int threads = 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (dirent* e = readdir(tasks)) threads += e->d_name[0] != '.';
    closedir(tasks);
  }
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
  bool shim_loaded = false;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) shim_loaded |= line.find("libquanta.so") != std::string::npos;
  std::printf("{\"threads\": %d, \"sockets\": %d, \"shim_loaded\": %s, \"dlsym_ok\": %s}\n", threads, sockets,
              shim_loaded ? "true" : "false", entry ? "true" : "false");
  return 0;
}
