/* Runs under LD_PRELOAD=libquanta.so and never calls CUDA: the shim must cost it nothing
 * (no thread, no socket or other descriptor, no driver loaded). */
#include <dirent.h>

#include "probe.h"

static int count_entries(const char* dir) {
  DIR* d = opendir(dir);
  int n = 0;
  if (!d) return -1;
  for (struct dirent* e; (e = readdir(d));)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

static int mapped(const char* needle) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, needle)) found = 1;
  if (maps) fclose(maps);
  return found;
}

int main(void) {
  CHECK(mapped("libquanta"), "libquanta.so is not loaded: the test must run with LD_PRELOAD");
  CHECK(count_entries("/proc/self/task") == 1, "%d threads, the shim started some",
        count_entries("/proc/self/task"));
  /* Descriptors inherited from the test runner (pipes, files) are fine; the shim must not
   * have opened a socket, an eventfd, a memfd or a shared-memory region of its own. */
  char path[64], target[256];
  for (int fd = 3; fd < 1024; ++fd) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    CHECK(strncmp(target, "socket:", 7) && strncmp(target, "anon_inode:", 11) &&
              strncmp(target, "/memfd:", 7) && strncmp(target, "/dev/shm/", 9) &&
              !strstr(target, "quanta"),
          "descriptor %d (%s) was opened by the shim", fd, target);
  }
  CHECK(!mapped("libcuda"), "the shim loaded libcuda into a process that never called CUDA");
  return probe_result();
}
