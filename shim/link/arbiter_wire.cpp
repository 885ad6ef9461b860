// Socket and region plumbing for the arbiter link: SOCK_SEQPACKET with SCM_RIGHTS, and
// mmap of the regions the arbiter passes, each checked before anything reads it.
#include "shim/link/arbiter_wire.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace quanta::shim {

namespace {

using common::ControlRegion;
using common::MessageHeader;
using common::MessageType;
using common::PodRegion;

constexpr int kSocketTimeoutSeconds = 2;

// fstat by system call: glibc >= 2.33 exports fstat@GLIBC_2.33 (before, it was an inline
// wrapper of __fxstat), and libquanta.so must load on glibc 2.17.
int stat_fd(int fd, struct stat* st) { return static_cast<int>(syscall(SYS_fstat, fd, st)); }
constexpr int kMaxFdsPerMessage = 4;

// Size a message of each type must have; 0 for types a tenant never receives or sends.
uint32_t expected_size(MessageType type) {
  switch (type) {
    case MessageType::kHello: return sizeof(common::HelloMessage);
    case MessageType::kWelcome: return sizeof(common::WelcomeMessage);
    case MessageType::kRefused: return sizeof(common::RefusedMessage);
    case MessageType::kAttach: return sizeof(common::AttachMessage);
    case MessageType::kAttached: return sizeof(common::AttachedMessage);
    case MessageType::kAttachFailed: return sizeof(common::AttachFailedMessage);
  }
  return 0;
}

template <typename Region>
Region* map_region(int fd, int prot, uint32_t magic, const char** why) {
  struct stat st {};
  if (stat_fd(fd, &st) != 0) {
    *why = "cannot stat the region descriptor";
    return nullptr;
  }
  if (static_cast<uint64_t>(st.st_size) < sizeof(Region)) {
    *why = "region file smaller than the layout this library expects";
    return nullptr;
  }
  void* address = mmap(nullptr, sizeof(Region), prot, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    *why = "mmap of the region failed";
    return nullptr;
  }
  auto* region = static_cast<Region*>(address);
  if (region->header.magic != magic || region->header.version != common::kLayoutVersion ||
      region->header.size != sizeof(Region)) {
    munmap(address, sizeof(Region));
    *why = "region has a foreign magic, layout version or size";
    return nullptr;
  }
  return region;
}

}  // namespace

int wire_connect(const char* path) noexcept {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = strlen(path);
  if (length == 0 || length >= sizeof address.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(address.sun_path, path, length);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval timeout{kSocketTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  int rc;
  do {
    rc = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

bool wire_send(int socket_fd, const void* message, size_t size) noexcept {
  ssize_t sent;
  do {
    sent = send(socket_fd, message, size, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(size);
}

long wire_receive(int socket_fd, void* buffer, size_t capacity, int* fds, int max_fds, int* fd_count) noexcept {
  memset(buffer, 0, capacity);
  *fd_count = 0;
  iovec iov{buffer, capacity};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  ssize_t received;
  do {
    received = recvmsg(socket_fd, &message, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) return -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (*fd_count < max_fds) fds[(*fd_count)++] = fd;
      else close(fd);
    }
  }
  if (message.msg_flags & MSG_TRUNC) {
    close_all(fds, *fd_count);
    *fd_count = 0;
    errno = EMSGSIZE;
    return -1;
  }
  return static_cast<long>(received);
}

bool wire_message_valid(const MessageHeader& header, long received) noexcept {
  if (received < static_cast<long>(sizeof(MessageHeader))) return false;
  if (header.magic != common::kWireMagic || header.version != common::kWireVersion) return false;
  const uint32_t size = expected_size(header.type);
  return size != 0 && header.size == size && received == static_cast<long>(size);
}

void close_all(const int* fds, int count) noexcept {
  for (int i = 0; i < count; ++i) close(fds[i]);
}

bool file_identity(int fd, FileIdentity* out) noexcept {
  struct stat st {};
  if (stat_fd(fd, &st) != 0) return false;
  out->device = static_cast<uint64_t>(st.st_dev);
  out->inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

const ControlRegion* map_control_region(int fd, const char** why) noexcept {
  return map_region<const ControlRegion>(fd, PROT_READ, common::kControlMagic, why);
}

PodRegion* map_pod_region(int fd, const char** why) noexcept {
  return map_region<PodRegion>(fd, PROT_READ | PROT_WRITE, common::kPodMagic, why);
}

}  // namespace quanta::shim
