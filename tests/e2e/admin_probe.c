/* Run inside a container: asks the arbiter's admin socket, as mounted at /run/quanta, for
 * its status, and prints the answer line. A C program, so the image needs no C++ runtime. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "/run/quanta/admin.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  if (fd < 0 || connect(fd, (struct sockaddr*)&addr, sizeof addr) != 0) {
    perror("connect");
    return 2;
  }
  /* An arbiter that refuses the caller answers at once and closes: the request may meet
   * a closed socket, the answer is still there to read. */
  const char request[] = "{\"cmd\":\"status\"}\n";
  if (send(fd, request, sizeof request - 1, MSG_NOSIGNAL) < 0) perror("send");
  char answer[65536];
  size_t have = 0;
  for (;;) {
    ssize_t n = read(fd, answer + have, sizeof answer - 1 - have);
    if (n <= 0) break;
    have += (size_t)n;
    if (memchr(answer, '\n', have) != NULL || have == sizeof answer - 1) break;
  }
  answer[have] = '\0';
  printf("%s", answer);
  return have > 0 ? 0 : 3;
}
