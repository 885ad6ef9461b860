// What a hostile image brings for the hook: a library it names in LD_PRELOAD or LD_AUDIT
// (or anything the loader reads), which appends "pid uid" to $HOSTILE_MARK wherever it is
// loaded. The hostile tests give the mark a host path no container can reach, so the mark
// existing means the library ran as the host's hook.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void record_where_it_ran(void) {
  const char* mark = getenv("HOSTILE_MARK");
  if (mark == NULL) return;
  const int fd = open(mark, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char line[64];
  const int n = snprintf(line, sizeof line, "pid %d uid %d\n", (int)getpid(), (int)getuid());
  if (n > 0 && write(fd, line, (size_t)n) < 0) {
    // nothing to do: the mark is best effort
  }
  close(fd);
}

// The rtld-audit entry point, so LD_AUDIT loads it too.
unsigned int la_version(unsigned int version) {
  return version;
}
