/* A process that loads libquanta.so and never calls CUDA: the shim must cost it nothing (no
 * thread, no descriptor, no driver loaded).
 *
 * `probe_idle --shim PATH` runs in two stages so that descriptors the process inherited
 * (a test runner or parent that leaked one) are told apart from ones the shim opened:
 * first without the shim, recording every open descriptor and the file behind it, then
 * re-executed with LD_PRELOAD=PATH, where every descriptor must be one of those.
 * `probe_idle --leak --shim PATH` first opens a socket pair and an eventfd that survive exec,
 * as a leaking parent would. */
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "tests/shim/probe.h"

#define MAX_BASELINE 256

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

struct open_fd {
  int fd;
  unsigned long long dev, ino;
};

/* Descriptors 3 and up that stay open across exec (close-on-exec ones vanish anyway). */
static int list_fds(struct open_fd* out, int capacity) {
  int n = 0;
  for (int fd = 3; fd < 4096 && n < capacity; ++fd) {
    struct stat st;
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC) || fstat(fd, &st) != 0) continue;
    out[n].fd = fd;
    out[n].dev = (unsigned long long)st.st_dev;
    out[n].ino = (unsigned long long)st.st_ino;
    ++n;
  }
  return n;
}

static int record_and_reexec(const char* self, const char* shim) {
  struct open_fd fds[MAX_BASELINE];
  const int n = list_fds(fds, MAX_BASELINE);
  char baseline[MAX_BASELINE * 48] = "";
  size_t used = 0;
  for (int i = 0; i < n; ++i)
    used += (size_t)snprintf(baseline + used, sizeof baseline - used, "%d:%llu:%llu,", fds[i].fd,
                             fds[i].dev, fds[i].ino);
  setenv("QUANTA_PROBE_BASELINE", baseline, 1);
  setenv("LD_PRELOAD", shim, 1);
  execl(self, self, (char*)NULL);
  fprintf(stderr, "cannot re-execute %s with the shim preloaded\n", self);
  return 1;
}

static int inherited(int fd, const struct stat* st, const char* baseline) {
  char wanted[80];
  snprintf(wanted, sizeof wanted, "%d:%llu:%llu,", fd, (unsigned long long)st->st_dev,
           (unsigned long long)st->st_ino);
  for (const char* p = baseline; p && *p;) {
    if (!strncmp(p, wanted, strlen(wanted))) return 1;
    p = strchr(p, ',');
    if (p) ++p;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && !strcmp(argv[1], "--leak")) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0, "socketpair failed");
    CHECK(eventfd(0, 0) >= 0, "eventfd failed");
    if (probe_result() != 0) return 1;
    argv[1] = argv[2];
    argv[2] = argv[3];
    argc = 3;
  }
  if (argc == 3 && !strcmp(argv[1], "--shim")) {
    CHECK(!mapped("libquanta"), "the first stage must run without the shim");
    if (probe_result() != 0) return 1;
    return record_and_reexec(argv[0], argv[2]);
  }
  const char* baseline = getenv("QUANTA_PROBE_BASELINE");
  CHECK(baseline != NULL, "run as probe_idle --shim PATH");
  CHECK(mapped("libquanta"), "libquanta.so is not loaded in the second stage");
  CHECK(count_entries("/proc/self/task") == 1, "%d threads, the shim started some",
        count_entries("/proc/self/task"));
  char path[64], target[256];
  for (int fd = 3; fd < 4096; ++fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) continue;
    if (inherited(fd, &st, baseline)) continue;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    CHECK(0, "descriptor %d (%s) was not inherited: the shim opened it", fd, target);
  }
  CHECK(!mapped("libcuda"), "the shim loaded libcuda into a process that never called CUDA");
  return probe_result();
}
