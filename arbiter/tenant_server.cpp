// The tenant socket: admission by SO_PEERCRED and cgroup (or a claimed pod when the node
// allows unregistered processes), Welcome with the pod region and a doorbell, Attach with
// a slot and the GPU's read-only control region. Any malformed packet drops only that
// connection, with a log line.
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "arbiter/arbiter.h"
#include "arbiter/death_watch.h"
#include "arbiter/unix_socket.h"
#include "common/clock.h"
#include "common/wire.h"

namespace quanta::arbiter {
namespace {

using common::MessageType;

template <typename T>
T make_message(MessageType type) {
  T m{};
  m.header = common::make_header<T>(type);
  return m;
}

void copy_text(char* dst, size_t cap, const std::string& text) {
  std::strncpy(dst, text.c_str(), cap - 1);
  dst[cap - 1] = '\0';
}

bool nul_terminated(const char* s, size_t cap) {
  return std::memchr(s, '\0', cap) != nullptr;
}

// A process needs one connection (a second Hello replaces the first); a few more cover
// a reconnect racing the old one's close.
constexpr size_t kMaxConnectionsPerPid = 4;
constexpr size_t kMaxConnections = 8192;

}  // namespace

void Arbiter::on_tenant_accept() {
  for (;;) {
    int fd = accept4(tenant_listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        spdlog::warn("tenant socket accept failed: {}", std::strerror(errno));
      }
      return;
    }
    PeerCred cred = peer_cred(fd);
    // The socket is open to every container: bound what one caller (or all) can hold.
    size_t same_pid = 0;
    for (const auto& [other_fd, c] : connections_) same_pid += c.pid == cred.pid ? 1 : 0;
    if (same_pid >= kMaxConnectionsPerPid || connections_.size() >= kMaxConnections) {
      spdlog::warn("refusing a tenant connection of pid {}: {} open from it, {} in all", cred.pid,
                   same_pid, connections_.size());
      ::close(fd);
      continue;
    }
    Connection& conn = connections_[fd];
    conn.sock.reset(fd);
    conn.pid = cred.pid;
    conn.uid = cred.uid;
    loop_.add(fd, [this, fd](uint32_t) { on_tenant_message(fd); });
  }
}

void Arbiter::close_connection(int fd, const std::string& why) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (!why.empty()) spdlog::warn("dropping tenant connection of pid {}: {}", conn.pid, why);
  loop_.remove(fd);
  if (conn.doorbell) loop_.remove(conn.doorbell.get());
  auto p = processes_.find(conn.pid);
  if (p != processes_.end() && p->second.connection == fd) p->second.connection = -1;
  connections_.erase(it);
}

void Arbiter::on_tenant_message(int fd) {
  alignas(8) unsigned char buf[1024];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  // Tenants never send descriptors: close any that came along.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int stray;
      std::memcpy(&stray, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      ::close(stray);
    }
  }
  if (n <= 0) {
    close_connection(fd, "");
    return;
  }
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return close_connection(fd, "oversized packet");
  if (static_cast<size_t>(n) < sizeof(common::MessageHeader)) {
    return close_connection(
        fd, "packet of " + std::to_string(n) + " bytes is shorter than a message header");
  }
  common::MessageHeader header;
  std::memcpy(&header, buf, sizeof(header));
  if (header.magic != common::kWireMagic)
    return close_connection(fd, "bad magic (not the Quanta protocol)");
  if (header.version != common::kWireVersion) {
    return close_connection(fd, "protocol version " + std::to_string(header.version) +
                                    ", this arbiter speaks " +
                                    std::to_string(common::kWireVersion));
  }
  if (header.size != static_cast<uint32_t>(n)) {
    return close_connection(fd, "header says " + std::to_string(header.size) +
                                    " bytes, packet has " + std::to_string(n));
  }
  switch (header.type) {
    case MessageType::kHello: {
      if (header.size != sizeof(common::HelloMessage))
        return close_connection(fd, "Hello of the wrong size");
      if (conn.welcomed) return close_connection(fd, "second Hello on one connection");
      common::HelloMessage hello;
      std::memcpy(&hello, buf, sizeof(hello));
      if (!nul_terminated(hello.claimed_pod, sizeof(hello.claimed_pod))) {
        return close_connection(fd, "Hello's pod name is not NUL-terminated");
      }
      return handle_hello(conn, hello.claimed_pod);
    }
    case MessageType::kAttach: {
      if (header.size != sizeof(common::AttachMessage))
        return close_connection(fd, "Attach of the wrong size");
      if (!conn.welcomed) return close_connection(fd, "Attach before a Welcome");
      common::AttachMessage attach;
      std::memcpy(&attach, buf, sizeof(attach));
      if (!nul_terminated(attach.uuid, sizeof(attach.uuid))) {
        return close_connection(fd, "Attach's UUID is not NUL-terminated");
      }
      return handle_attach(conn, attach.uuid);
    }
    default:
      return close_connection(
          fd, "unexpected message type " + std::to_string(static_cast<uint32_t>(header.type)));
  }
}

void Arbiter::refuse(Connection& conn, const std::string& reason) {
  spdlog::info("refusing pid {}: {}", conn.pid, reason);
  auto m = make_message<common::RefusedMessage>(MessageType::kRefused);
  copy_text(m.reason, sizeof(m.reason), reason);
  send_with_fds(conn.sock.get(), &m, sizeof(m), {});
  close_connection(conn.sock.get(), "");  // the tenant runs ungated and needs nothing more
}

void Arbiter::handle_hello(Connection& conn, const std::string& claimed_pod) {
  const pid_t pid = conn.pid;
  auto existing = processes_.find(pid);
  Process* proc = existing == processes_.end() ? nullptr : &existing->second;
  if (proc == nullptr) {
    std::string cgroup = cgroup_of(pid);
    std::string key;
    if (const Registration* reg = pods_.match_cgroup(cgroup)) {
      key = reg->pod_key();
    } else if (!config_.allow_unregistered) {
      return refuse(
          conn, "pid " + std::to_string(pid) + " (cgroup " + (cgroup.empty() ? "unknown" : cgroup) +
                    ") is not in a registered container and this node does not admit unregistered "
                    "processes (allow_unregistered = false): running ungated");
    } else if (claimed_pod.empty()) {
      return refuse(
          conn, "pid " + std::to_string(pid) +
                    " is not in a registered container and names no pod: set QUANTA_POD=<name>");
    } else {
      key = claimed_pod;
    }
    UniqueFd pidfd = open_pidfd(pid);
    if (!pidfd)
      return refuse(conn,
                    "pid " + std::to_string(pid) + " could not be watched (pidfd_open failed)");
    Pod* pod = nullptr;
    try {
      pod = &pods_.get_or_create(key);
    } catch (const std::exception& e) {
      return refuse(conn, std::string("no region for pod ") + key + ": " + e.what());
    }
    uint32_t proc_index = common::kMaxProcsPerPod;
    for (uint32_t i = 0; i < common::kMaxProcsPerPod; ++i) {
      bool taken = pod->region->procs[i].pid.load() != 0;
      if (!taken) {
        proc_index = i;
        break;
      }
    }
    if (proc_index == common::kMaxProcsPerPod) {
      pods_.release_if_unused(pod->index);
      return refuse(conn, "pod " + key + " already has " + std::to_string(common::kMaxProcsPerPod) +
                              " processes on the GPUs, the most one pod may have");
    }
    common::ProcEntry& entry = pod->region->procs[proc_index];
    for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
      std::memset(static_cast<void*>(&entry.gpus[g]), 0, sizeof(common::GateChannel));
    }
    entry.pid.store(static_cast<uint32_t>(pid), std::memory_order_release);
    ++pod->processes;
    Process& p = processes_[pid];
    p.pid = pid;
    p.pidfd = std::move(pidfd);
    p.pod_index = pod->index;
    p.proc_index = proc_index;
    watch_process(p);
    proc = &p;
    spdlog::info("admitted pid {} into pod {} (pod region {}, entry {})", pid, key, pod->index,
                 proc_index);
  }
  Pod* pod = pods_.find(proc->pod_index);
  if (proc->connection >= 0 && proc->connection != conn.sock.get())
    close_connection(proc->connection, "");
  proc->connection = conn.sock.get();

  int doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (doorbell < 0) return refuse(conn, std::string("eventfd failed: ") + std::strerror(errno));
  conn.doorbell.reset(doorbell);
  int sock = conn.sock.get();
  loop_.add(doorbell, [this, sock](uint32_t) { on_doorbell(sock); });
  conn.welcomed = true;

  auto m = make_message<common::WelcomeMessage>(MessageType::kWelcome);
  m.pod_index = proc->pod_index;
  m.proc_index = proc->proc_index;
  m.arbiter_generation = generation_;
  copy_text(m.pod_key, sizeof(m.pod_key), pod->key);
  m.flags = config_.enforce.enforce ? common::kWelcomeEnforced : 0;
  m.count_managed = config_.shim.count_managed ? 1 : 0;
  m.context_overhead = config_.shim.context_overhead;
  UniqueFd pod_fd(pod->region.open_fd(true));
  if (!send_with_fds(sock, &m, sizeof(m), {pod_fd.get(), doorbell})) {
    close_connection(sock, "");
  }
}

void Arbiter::handle_attach(Connection& conn, const std::string& uuid) {
  Gpu* gpu = gpu_by_uuid(uuid);
  if (gpu == nullptr) {
    auto m = make_message<common::AttachFailedMessage>(MessageType::kAttachFailed);
    copy_text(m.reason, sizeof(m.reason),
              "GPU " + uuid + " is not managed by this arbiter; it manages " + managed_list());
    send_with_fds(conn.sock.get(), &m, sizeof(m), {});
    return;
  }
  Process& proc = processes_.at(conn.pid);
  Pod& pod = *pods_.find(proc.pod_index);
  auto have = proc.slots.find(gpu->index);
  SlotId slot;
  if (have != proc.slots.end()) {
    slot = have->second;
  } else {
    slot = common::kNoSlot;
    for (SlotId s = 0; s < common::kMaxSlotsPerGpu; ++s) {
      if (gpu->slot_pids.count(s) == 0 && gpu->region->slots[s].pid.load() == 0) {
        slot = s;
        break;
      }
    }
    if (slot == common::kNoSlot) {
      auto m = make_message<common::AttachFailedMessage>(MessageType::kAttachFailed);
      copy_text(
          m.reason, sizeof(m.reason),
          "GPU " + uuid + " already has " + std::to_string(common::kMaxSlotsPerGpu) + " tenants");
      send_with_fds(conn.sock.get(), &m, sizeof(m), {});
      return;
    }
    proc.slots[gpu->index] = slot;
    gpu->slot_pids[slot] = proc.pid;
    gpu->sched->set_pod_policy(pod.index, pod.policy);
    gpu->sched->add_tenant(slot, pod.index, common::monotonic_ns());
    fill_slot(*gpu, slot, proc, pod);
    gpu->dirty = true;
    spdlog::info("pid {} of pod {} attached to GPU {} as slot {}", proc.pid, pod.key, gpu->uuid,
                 slot);
  }
  auto m = make_message<common::AttachedMessage>(MessageType::kAttached);
  m.gpu_index = gpu->index;
  m.slot = slot;
  bool send_fd = conn.control_sent.count(gpu->index) == 0;
  m.fd_attached = send_fd ? 1 : 0;
  if (send_fd) {
    UniqueFd control(gpu->region.open_fd(false));
    if (!send_with_fds(conn.sock.get(), &m, sizeof(m), {control.get()}))
      return close_connection(conn.sock.get(), "");
    conn.control_sent.insert(gpu->index);
  } else if (!send_with_fds(conn.sock.get(), &m, sizeof(m), {})) {
    close_connection(conn.sock.get(), "");
  }
}

void Arbiter::on_doorbell(int sock) {
  auto it = connections_.find(sock);
  if (it == connections_.end()) return;
  uint64_t count = 0;
  ssize_t r = ::read(it->second.doorbell.get(), &count, sizeof(count));
  (void)r;
  auto p = processes_.find(it->second.pid);
  if (p == processes_.end()) return;
  for (const auto& [gpu_index, slot] : p->second.slots) gpus_[gpu_index]->dirty = true;
}

}  // namespace quanta::arbiter
