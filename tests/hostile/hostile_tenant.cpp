// quanta-hostile: a tenant that attacks everything a tenant can reach, for the hostile
// suite. It speaks the tenant socket itself (no shim), tries to make its control regions
// writable and to resize every region it holds, writes chosen and random bytes over all
// of its pod region, rings its doorbell as fast as it can, floods the socket with idle
// connections and with malformed, truncated, oversized and out-of-order messages, claims
// another pod's name, and allocates device memory straight from the driver. One JSON
// object on stdout counts what it tried and what (wrongly) worked.
//
//   quanta-hostile SECONDS SEED CLAIM UUID...   (socket: QUANTA_SOCKET, own pod: QUANTA_POD)
#include <cuda.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/shm_layout.h"
#include "common/wire.h"

namespace {

using namespace quanta::common;

struct Counts {
  long control_writable = 0;  // writable mappings or writes of a control region that worked
  long resized = 0;           // truncations or growths of any region that worked
  long sealed = 0;            // seals it managed to add
  long messages = 0;          // malformed or out-of-order packets sent
  long doorbells = 0;
  long connections = 0;        // idle connections it held
  long welcomed_as_other = 0;  // Hellos claiming another pod that got that pod
  unsigned long long bypass_bytes = 0;
};

int connect_to(const char* path, bool nonblock = false) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EAGAIN) {
    close(fd);
    return -1;
  }
  return fd;
}

// One message in, its descriptors into `fds`.
long receive(int fd, void* buf, size_t cap, std::vector<int>* fds, int timeout_ms = 2000) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return -1;
  iovec iov{buf, cap};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  long n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(f);
    }
  }
  return n;
}

HelloMessage hello(const char* pod) {
  HelloMessage m{};
  m.header = make_header<HelloMessage>(MessageType::kHello);
  std::snprintf(m.claimed_pod, sizeof(m.claimed_pod), "%s", pod);
  return m;
}

AttachMessage attach(const char* uuid) {
  AttachMessage m{};
  m.header = make_header<AttachMessage>(MessageType::kAttach);
  std::snprintf(m.uuid, sizeof(m.uuid), "%s", uuid);
  return m;
}

// Everything a root tenant could try on a region descriptor it was given.
void attack_descriptor(int fd, bool control, Counts* c) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  int rw = open(self.c_str(), O_RDWR | O_CLOEXEC);
  int target = rw >= 0 ? rw : fd;
  if (control) {
    void* w = mmap(nullptr, sizeof(ControlRegion), PROT_READ | PROT_WRITE, MAP_SHARED, target, 0);
    if (w != MAP_FAILED) {
      ++c->control_writable;
      munmap(w, sizeof(ControlRegion));
    }
    const char byte = 0x7f;
    if (pwrite(target, &byte, 1, 200) == 1) ++c->control_writable;
    if (fallocate(target, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1 << 16) == 0)
      ++c->control_writable;
    void* ro = mmap(nullptr, sizeof(ControlRegion), PROT_READ, MAP_SHARED, fd, 0);
    if (ro != MAP_FAILED) {
      if (mprotect(ro, 4096, PROT_READ | PROT_WRITE) == 0) ++c->control_writable;
      munmap(ro, sizeof(ControlRegion));
    }
  }
  if (ftruncate(target, 0) == 0) ++c->resized;
  if (ftruncate(target, 64 << 20) == 0) ++c->resized;
  if (fcntl(target, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_FUTURE_WRITE) == 0) ++c->sealed;
  if (rw >= 0) close(rw);
}

// Writes chosen and random words over the whole pod region.
void scribble(PodRegion* pod, std::mt19937_64& rng, uint32_t round) {
  if (round % 4 == 0) {
    auto* words = reinterpret_cast<uint64_t*>(pod);
    for (size_t i = 0; i < sizeof(PodRegion) / sizeof(uint64_t); ++i) words[i] = rng();
    return;
  }
  std::snprintf(pod->header.pod_key, sizeof(pod->header.pod_key), "%s",
                round % 3 ? "victim" : "default/heavy");
  pod->header.magic = static_cast<uint32_t>(rng());
  for (uint32_t g = 0; g < kMaxGpus; ++g) pod->memory_used[g].store(round % 2 ? 0 : ~0ull);
  for (ProcEntry& e : pod->procs) {
    e.pid.store(static_cast<uint32_t>(rng() % 65536));
    for (GateChannel& ch : e.gpus) {
      ch.want.store(1);
      ch.released_turn.store(static_cast<uint32_t>(rng()));
      ch.inflight_ns.store(~0ull);
      ch.memory_used.store(rng());
      ch.last_launch_ns.store(~0ull - (rng() & 0xffff));
    }
  }
}

// Malformed, truncated, oversized and out-of-order packets, each on a fresh connection.
void send_garbage(const char* socket_path, std::mt19937_64& rng,
                  const std::vector<std::string>& uuids, Counts* c) {
  int fd = connect_to(socket_path);
  if (fd < 0) return;
  std::vector<unsigned char> bytes;
  switch (rng() % 7) {
    case 0: {  // random bytes of random length, larger than any message included
      bytes.resize(1 + rng() % 3000);
      for (auto& b : bytes) b = static_cast<unsigned char>(rng());
      break;
    }
    case 1: {  // a truncated Hello
      HelloMessage h = hello("evil");
      bytes.assign(reinterpret_cast<unsigned char*>(&h),
                   reinterpret_cast<unsigned char*>(&h) + 1 + rng() % (sizeof(h) - 1));
      break;
    }
    case 2: {  // an Attach before any Hello
      AttachMessage a = attach(uuids.empty() ? "GPU-x" : uuids[0].c_str());
      bytes.assign(reinterpret_cast<unsigned char*>(&a),
                   reinterpret_cast<unsigned char*>(&a) + sizeof(a));
      break;
    }
    case 3: {  // a header that lies about its size
      HelloMessage h = hello("evil");
      h.header.size = static_cast<uint32_t>(rng());
      bytes.assign(reinterpret_cast<unsigned char*>(&h),
                   reinterpret_cast<unsigned char*>(&h) + sizeof(h));
      break;
    }
    case 4: {  // a Hello without a NUL in its name
      HelloMessage h = hello("");
      std::memset(h.claimed_pod, 'A', sizeof(h.claimed_pod));
      bytes.assign(reinterpret_cast<unsigned char*>(&h),
                   reinterpret_cast<unsigned char*>(&h) + sizeof(h));
      break;
    }
    case 5: {  // a reply type sent to the arbiter, and an unknown type
      HelloMessage h = hello("evil");
      h.header.type = static_cast<MessageType>(rng() % 2 ? 2 : 99);
      bytes.assign(reinterpret_cast<unsigned char*>(&h),
                   reinterpret_cast<unsigned char*>(&h) + sizeof(h));
      break;
    }
    default: {  // two Hellos, then an Attach of nonsense
      HelloMessage h = hello("evil");
      send(fd, &h, sizeof(h), MSG_NOSIGNAL);
      send(fd, &h, sizeof(h), MSG_NOSIGNAL);
      AttachMessage a = attach("GPU-\x01\x02 nonsense");
      bytes.assign(reinterpret_cast<unsigned char*>(&a),
                   reinterpret_cast<unsigned char*>(&a) + sizeof(a));
      break;
    }
  }
  send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ++c->messages;
  close(fd);
}

void bypass_the_shim(Counts* c) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return;
  for (int i = 0; i < 4; ++i) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 32ull << 20) == CUDA_SUCCESS) c->bypass_bytes += 32ull << 20;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: quanta-hostile SECONDS SEED CLAIM UUID...\n");
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  std::mt19937_64 rng(std::strtoull(argv[2], nullptr, 10));
  const char* claim = argv[3];
  std::vector<std::string> uuids(argv + 4, argv + argc);
  const char* socket_path = std::getenv("QUANTA_SOCKET");
  const char* own_pod = std::getenv("QUANTA_POD");
  if (socket_path == nullptr || own_pod == nullptr) {
    std::fprintf(stderr, "quanta-hostile: set QUANTA_SOCKET and QUANTA_POD\n");
    return 2;
  }
  Counts c;
  bool welcomed = false;

  // Its own admission, regions and doorbell.
  int conn = connect_to(socket_path);
  HelloMessage h = hello(own_pod);
  send(conn, &h, sizeof(h), MSG_NOSIGNAL);
  union {
    MessageHeader header;
    WelcomeMessage welcome;
    AttachedMessage attached;
    char bytes[1024];
  } reply{};
  std::vector<int> fds;
  PodRegion* pod = nullptr;
  int doorbell = -1;
  if (receive(conn, &reply, sizeof(reply), &fds) > 0 &&
      reply.header.type == MessageType::kWelcome && fds.size() == 2) {
    welcomed = true;
    attack_descriptor(fds[0], /*control=*/false, &c);
    void* p = mmap(nullptr, sizeof(PodRegion), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (p != MAP_FAILED) pod = static_cast<PodRegion*>(p);
    doorbell = fds[1];
  }
  for (const std::string& uuid : uuids) {
    AttachMessage a = attach(uuid.c_str());
    send(conn, &a, sizeof(a), MSG_NOSIGNAL);
    std::vector<int> control;
    if (receive(conn, &reply, sizeof(reply), &control) > 0 && !control.empty()) {
      attack_descriptor(control[0], /*control=*/true, &c);
    }
  }
  // Another pod's name, from a second connection of the same process and from a child.
  {
    int other = connect_to(socket_path);
    HelloMessage claim_hello = hello(claim);
    send(other, &claim_hello, sizeof(claim_hello), MSG_NOSIGNAL);
    std::vector<int> got;
    if (receive(other, &reply, sizeof(reply), &got) > 0 &&
        reply.header.type == MessageType::kWelcome &&
        std::strcmp(reply.welcome.pod_key, claim) == 0)
      ++c.welcomed_as_other;
    for (int f : got) close(f);
    close(other);
  }
  // Idle connections held for the whole run.
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    int fd = connect_to(socket_path, /*nonblock=*/true);
    if (fd >= 0) idle.push_back(fd);
  }
  c.connections = static_cast<long>(idle.size());
  bypass_the_shim(&c);

  const uint64_t end = monotonic_ns() + static_cast<uint64_t>(seconds * 1e9);
  for (uint32_t round = 0; monotonic_ns() < end; ++round) {
    if (pod != nullptr) scribble(pod, rng, round);
    for (int i = 0; i < 50 && doorbell >= 0; ++i) {
      uint64_t one = 1;
      if (write(doorbell, &one, sizeof(one)) == sizeof(one)) ++c.doorbells;
    }
    if (round % 4 == 0) send_garbage(socket_path, rng, uuids, &c);
    if (round % 16 == 0 && !uuids.empty()) {  // attach again, and to nonsense
      AttachMessage a = attach(rng() % 2 ? uuids[rng() % uuids.size()].c_str() : "MIG-nowhere");
      send(conn, &a, sizeof(a), MSG_NOSIGNAL | MSG_DONTWAIT);
      std::vector<int> got;
      receive(conn, &reply, sizeof(reply), &got, 10);
      for (int f : got) close(f);
    }
    usleep(1000);
  }
  std::printf(
      "{\"welcomed\": %s, \"control_writable\": %ld, \"resized\": %ld, \"sealed\": %ld, "
      "\"messages\": %ld, "
      "\"doorbells\": %ld, \"connections\": %ld, \"welcomed_as_other\": %ld, \"bypass_bytes\": "
      "%llu}\n",
      welcomed ? "true" : "false", c.control_writable, c.resized, c.sealed, c.messages, c.doorbells,
      c.connections, c.welcomed_as_other, c.bypass_bytes);
  return 0;
}
