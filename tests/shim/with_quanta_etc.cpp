// with_quanta_etc FILES_DIR SCRATCH_DIR -- COMMAND [ARGS...]
//
// Runs COMMAND (exec: same pid) in a private mount namespace whose /etc/quanta holds exactly
// the node.conf and container.conf found in FILES_DIR (either may be missing), so tests give
// libquanta.so the node settings it reads from fixed paths without touching the machine's
// /etc and without any way for a tenant to move those paths. /etc is an overlay of the real
// one (upper layer on a tmpfs mounted at SCRATCH_DIR, an empty folder the caller removes).
// Needs root (CAP_SYS_ADMIN); exits 77 (CTest's skip code) when it cannot set that up.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr int kSkip = 77;

int skip(const std::string& what) {
  std::fprintf(stderr, "with_quanta_etc: %s: %s (needs root in the initial user namespace)\n",
               what.c_str(), std::strerror(errno));
  return kSkip;
}

bool copy_file(const std::string& from, const std::string& to) {
  const int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return errno == ENOENT;  // absent: the test wants no such file
  const int out = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = out >= 0;
  char buffer[4096];
  for (ssize_t n; ok && (n = read(in, buffer, sizeof buffer)) > 0;) ok = write(out, buffer, n) == n;
  close(in);
  if (out >= 0) close(out);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::strcmp(argv[3], "--") != 0) {
    std::fprintf(stderr, "usage: with_quanta_etc FILES_DIR SCRATCH_DIR -- COMMAND [ARGS...]\n");
    return 2;
  }
  const std::string files = argv[1];
  const std::string scratch = argv[2];
  if (geteuid() != 0) {
    errno = EPERM;
    return skip("not root");
  }
  if (unshare(CLONE_NEWNS) != 0) return skip("unshare(CLONE_NEWNS)");
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return skip("making / private");
  if (mkdir(scratch.c_str(), 0700) != 0 && errno != EEXIST) return skip("mkdir " + scratch);
  if (mount("quanta-etc", scratch.c_str(), "tmpfs", 0, "mode=0700") != 0) return skip("tmpfs on " + scratch);
  const std::string upper = scratch + "/upper", work = scratch + "/work";
  if (mkdir(upper.c_str(), 0755) != 0 || mkdir(work.c_str(), 0755) != 0) return skip("overlay folders");
  const std::string options = "lowerdir=/etc,upperdir=" + upper + ",workdir=" + work;
  if (mount("quanta-etc", "/etc", "overlay", 0, options.c_str()) != 0) return skip("overlay on /etc");
  mkdir("/etc/quanta", 0755);  // in the overlay only
  // A clean folder even where the machine has an /etc/quanta of its own.
  if (mount("quanta-etc", "/etc/quanta", "tmpfs", 0, "mode=0755") != 0) return skip("tmpfs on /etc/quanta");
  for (const char* name : {"node.conf", "container.conf"}) {
    if (!copy_file(files + "/" + name, std::string("/etc/quanta/") + name)) {
      std::fprintf(stderr, "with_quanta_etc: cannot copy %s/%s: %s\n", files.c_str(), name,
                   std::strerror(errno));
      return 1;
    }
  }
  // Read-only, as quanta-hook mounts them into containers.
  mount(nullptr, "/etc/quanta", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr);
  execvp(argv[4], argv + 4);
  std::fprintf(stderr, "with_quanta_etc: cannot run %s: %s\n", argv[4], std::strerror(errno));
  return 127;
}
