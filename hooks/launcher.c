// quanta-hook as container runtimes start it: a static program with no C library and no
// dynamic loader, so nothing a container controls (its environment, its working directory)
// can run code in it. For a hook stage (`quanta-hook oci ...`) it starts the real
// quanta-hook (<its folder>/../libexec/quanta-hook) with a fixed environment and "/" as
// working directory; for the operator's own commands (cdi/hooksd generate, --help) it
// starts it with the caller's environment and folder unchanged. docs/containers.md
// ("What the hook trusts") says why both halves exist.
//
// Freestanding on purpose: a C library's start-up code reads its environment (glibc parses
// GLIBC_TUNABLES even in static programs) before main, which is exactly what must not
// happen here. Only raw system calls; x86-64 and AArch64.
#include <asm/unistd.h>
#include <linux/fcntl.h>

typedef unsigned long size_t;

#if defined(__x86_64__)
static long sys3(long n, long a, long b, long c) {
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
}
static long sys4(long n, long a, long b, long c, long d) {
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
}
// The kernel enters here with the stack holding argc, argv[], NULL, envp[], NULL, auxv.
__asm__(".text\n.global _start\n_start:\n  xor %rbp, %rbp\n  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n  call launch\n  hlt\n");
#elif defined(__aarch64__)
static long sys4(long n, long a, long b, long c, long d) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
}
static long sys3(long n, long a, long b, long c) { return sys4(n, a, b, c, 0); }
__asm__(".text\n.global _start\n_start:\n  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n"
        "  bl launch\n  brk #0\n");
#else
#error "quanta-hook's launcher supports x86-64 and AArch64"
#endif

#define kPath "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
#define kTarget "/../libexec/quanta-hook"

static size_t length(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

static void say(const char* a, const char* b) {
  sys3(__NR_write, 2, (long)"quanta-hook: ", 13);
  sys3(__NR_write, 2, (long)a, (long)length(a));
  if (b != 0) sys3(__NR_write, 2, (long)b, (long)length(b));
  sys3(__NR_write, 2, (long)"\n", 1);
}

static void leave(int code) __attribute__((noreturn));
static void leave(int code) {
  for (;;) sys3(__NR_exit_group, code, 0, 0);
}

static int same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

void launch(long* stack) __attribute__((noreturn, used));
void launch(long* stack) {
  const long argc = stack[0];
  char** argv = (char**)(stack + 1);
  char** envp = argv + argc + 1;

  // The folder this program lives in, as the kernel knows it (symbolic links resolved).
  static char target[4096];
  const long n = sys4(__NR_readlinkat, AT_FDCWD, (long)"/proc/self/exe", (long)target,
                      sizeof(target) - sizeof(kTarget));
  if (n <= 0) {
    say("cannot read /proc/self/exe to find the real quanta-hook beside this launcher", 0);
    leave(127);
  }
  long slash = n - 1;
  while (slash > 0 && target[slash] != '/') --slash;
  for (size_t i = 0; i < sizeof(kTarget); ++i) target[slash + i] = kTarget[i];

  // A hook stage runs as host root with whatever the runtime handed it: the container's
  // environment (runc with a hook that names none) and the container's rootfs as working
  // directory. Neither reaches the real program.
  static char* const clean_env[] = {kPath, 0};
  if (argc > 1 && same(argv[1], "oci")) {
    envp = (char**)clean_env;
    if (sys3(__NR_chdir, (long)"/", 0, 0) != 0) {
      say("cannot change to the folder /", 0);
      leave(127);
    }
    sys3(__NR_umask, 022, 0, 0);
  }
  sys3(__NR_execve, (long)target, (long)argv, (long)envp);
  say("cannot run ", target);
  leave(127);
}
