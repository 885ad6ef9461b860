// FakeArbiter: one thread, poll over the listening socket and its connections, answering
// Hello and Attach from its script; the heartbeat is refreshed every poll round.
#include "tests/integration/fake_arbiter.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace quanta::integration {

namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

template <typename Region>
Region* make_region(const char* name, int* fd) {
  *fd = memfd_create(name, MFD_CLOEXEC);
  if (*fd < 0 || ftruncate(*fd, sizeof(Region)) != 0) return nullptr;
  void* memory = mmap(nullptr, sizeof(Region), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  return memory == MAP_FAILED ? nullptr : static_cast<Region*>(memory);
}

template <typename T>
T message(common::MessageType type) {
  T m{};
  m.header = common::make_header<T>(type);
  return m;
}

}  // namespace

FakeArbiter::FakeArbiter(const std::string& socket_path, FakeArbiterScript script)
    : path_(socket_path), script_(script) {
  pod_ = make_region<common::PodRegion>("fake-pod", &pod_fd_);
  control_ = make_region<common::ControlRegion>("fake-control", &control_fd_);
  if (!pod_ || !control_) {
    ADD_FAILURE() << "FakeArbiter: cannot make its regions";
    return;
  }
  pod_->header.magic = common::kPodMagic;
  pod_->header.version = common::kLayoutVersion;
  pod_->header.size = sizeof(common::PodRegion);
  std::snprintf(pod_->header.pod_key, sizeof pod_->header.pod_key, "fake/pod");
  control_->header.magic = common::kControlMagic;
  control_->header.version = common::kLayoutVersion;
  control_->header.size = sizeof(common::ControlRegion);
  control_->header.gpu_index = 0;
  control_->header.lease_ns.store(1000000000ull);
  control_->header.heartbeat_ns.store(now_ns());
  control_->header.holder.store(common::kNoSlot);
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path_.c_str());
  unlink(path_.c_str());
  if (listen_fd_ < 0 ||
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listen_fd_, 64) != 0) {
    ADD_FAILURE() << "FakeArbiter: cannot listen on " << path_ << ": " << std::strerror(errno);
    return;
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { serve(); });
}

FakeArbiter::~FakeArbiter() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t ignored = write(stop_fd_, &one, sizeof one);
    (void)ignored;
    thread_.join();
  }
  for (int fd : connections_) close(fd);
  for (int fd : {listen_fd_, stop_fd_, pod_fd_, control_fd_})
    if (fd >= 0) close(fd);
  if (pod_) munmap(pod_, sizeof(common::PodRegion));
  if (control_) munmap(control_, sizeof(common::ControlRegion));
  unlink(path_.c_str());
}

uint64_t FakeArbiter::pod_used() const {
  return pod_ ? pod_->memory_used[0].load() : 0;
}

void FakeArbiter::refuse_from_now_on(common::RefusedAction action) {
  std::lock_guard lock(mutex_);
  refuse_action_.store(static_cast<int>(action));
  for (common::ControlSlot& slot : control_->slots) {  // nobody holds a slot any more
    slot.owner.store(0);
    if (slot.turn.load() & 1u) slot.turn.fetch_add(1);
  }
  for (int fd : connections_) shutdown(fd, SHUT_RDWR);  // the shims see the arbiter go
}

void FakeArbiter::send(int fd, const void* m, size_t size, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(m), size};
  msghdr header{};
  header.msg_iov = &iov;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  if (!fds.empty()) {
    header.msg_control = control;
    header.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  sendmsg(fd, &header, MSG_NOSIGNAL);
}

void FakeArbiter::on_message(int fd) {
  union {
    common::MessageHeader header;
    common::HelloMessage hello;
    common::AttachMessage attach;
  } in{};
  const ssize_t n = recv(fd, &in, sizeof in, 0);
  if (n <= 0) {
    close(fd);
    std::lock_guard lock(mutex_);
    std::erase(connections_, fd);
    return;
  }
  ucred peer{};
  socklen_t length = sizeof peer;
  getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length);
  uint32_t proc = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = std::find(peers_.begin(), peers_.end(), peer.pid);
    if (it == peers_.end()) {
      peers_.push_back(peer.pid);
      it = peers_.end() - 1;
    }
    proc = static_cast<uint32_t>(it - peers_.begin()) % common::kMaxProcsPerPod;
  }
  if (in.header.type == common::MessageType::kHello) {
    const int count = ++hellos_;
    const int forced = refuse_action_.load();
    if (script_.other_version != 0) {
      auto m = message<common::RefusedMessage>(common::MessageType::kRefused);
      m.header.version = script_.other_version;
      std::snprintf(m.reason, sizeof m.reason, "an arbiter of another release");
      send(fd, &m, sizeof m, {});
      return;
    }
    if (forced >= 0 || script_.refuse_open || count <= script_.deny_first) {
      auto m = message<common::RefusedMessage>(common::MessageType::kRefused);
      m.action = forced >= 0           ? static_cast<common::RefusedAction>(forced)
                 : script_.refuse_open ? common::RefusedAction::kRunOpen
                                       : common::RefusedAction::kDeny;
      std::snprintf(m.reason, sizeof m.reason, "refused by the fake arbiter's script (hello %d)",
                    count);
      send(fd, &m, sizeof m, {});
      return;
    }
    pod_->procs[proc].pid.store(static_cast<uint32_t>(peer.pid));
    auto m = message<common::WelcomeMessage>(common::MessageType::kWelcome);
    m.pod_index = 0;
    m.proc_index = proc;
    m.arbiter_generation = 1;
    std::snprintf(m.pod_key, sizeof m.pod_key, "fake/pod");
    m.flags = script_.welcome_flags;
    m.count_managed = script_.count_managed;
    m.context_overhead = script_.context_overhead;
    const int doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    send(fd, &m, sizeof m, {pod_fd_, doorbell});
    close(doorbell);
    ++welcomes_;
  } else if (in.header.type == common::MessageType::kAttach) {
    if (in.attach.flags & common::kAttachObserve) {
      auto m = message<common::AttachedMessage>(common::MessageType::kAttached);
      m.slot = common::kNoSlot;
      m.memory_cap = script_.memory_cap;
      send(fd, &m, sizeof m, {});
      return;
    }
    ++attaches_;
    common::ControlSlot& slot = control_->slots[proc];
    pod_->memory_cap[0].store(script_.memory_cap);
    pod_->procs[proc].limits[0].slot.store(proc);
    const uint32_t owner = proc + 1;  // any word but 0 that is this process's alone
    slot.owner.store(owner);
    if (!(slot.turn.load() & 1u)) slot.turn.fetch_add(1);  // granted, for good
    auto m = message<common::AttachedMessage>(common::MessageType::kAttached);
    m.gpu_index = 0;
    m.slot = proc;
    m.owner = owner;
    m.fd_attached = 1;
    send(fd, &m, sizeof m, {control_fd_});
  }
}

void FakeArbiter::serve() {
  for (;;) {
    std::vector<pollfd> watched = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    {
      std::lock_guard lock(mutex_);
      for (int fd : connections_) watched.push_back({fd, POLLIN, 0});
    }
    poll(watched.data(), watched.size(), 50);
    control_->header.heartbeat_ns.store(now_ns());
    if (watched[0].revents) return;
    if (watched[1].revents & POLLIN) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        std::lock_guard lock(mutex_);
        connections_.push_back(fd);
      }
    }
    for (size_t i = 2; i < watched.size(); ++i) {
      if (watched[i].revents) on_message(watched[i].fd);
    }
  }
}

}  // namespace quanta::integration
