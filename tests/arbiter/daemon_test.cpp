// quanta-arbiter as a process: started on a temporary config (unique scope, sockets in a
// temp dir, its own simgpu state), spoken to over the real tenant and admin sockets from
// this test and from forked tenant processes, as libquanta.so and quantactl would.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/death_watch.h"
#include "arbiter/unix_socket.h"
#include "common/clock.h"
#include "common/shm_layout.h"
#include "common/wire.h"

namespace quanta::arbiter {
namespace {

using common::kNsPerMs;
using common::MessageType;
using nlohmann::json;

// ---- wire helpers -------------------------------------------------------------------

struct Packet {
  std::vector<unsigned char> bytes;
  std::vector<int> fds;
  bool closed = false;
  MessageType type() const {
    common::MessageHeader h{};
    if (bytes.size() >= sizeof(h)) std::memcpy(&h, bytes.data(), sizeof(h));
    return h.type;
  }
  template <typename T>
  T as() const {
    T m{};
    std::memcpy(&m, bytes.data(), std::min(bytes.size(), sizeof(T)));
    return m;
  }
  void close_fds() {
    for (int fd : fds) ::close(fd);
    fds.clear();
  }
};

Packet receive(int fd, int timeout_ms = 3000) {
  Packet p;
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return p;
  unsigned char buf[2048];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) {
    p.closed = true;
    return p;
  }
  p.bytes.assign(buf, buf + n);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      p.fds.push_back(f);
    }
  }
  return p;
}

template <typename T>
void send_message(int fd, const T& m) {
  ASSERT_TRUE(send_with_fds(fd, &m, sizeof(m), {}));
}

common::HelloMessage hello(const std::string& pod) {
  common::HelloMessage m{};
  m.header = common::make_header<common::HelloMessage>(MessageType::kHello);
  std::strncpy(m.claimed_pod, pod.c_str(), sizeof(m.claimed_pod) - 1);
  return m;
}

common::AttachMessage attach(const std::string& uuid) {
  common::AttachMessage m{};
  m.header = common::make_header<common::AttachMessage>(MessageType::kAttach);
  std::strncpy(m.uuid, uuid.c_str(), sizeof(m.uuid) - 1);
  return m;
}

template <typename T>
T* map_fd(int fd, bool writable) {
  void* p =
      mmap(nullptr, sizeof(T), writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<T*>(p);
}

template <typename T>
T* map_name(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  T* p = map_fd<T>(fd, true);
  ::close(fd);
  return p;
}

// Polls `cond` every 100 us until it holds or `timeout_ms` passes.
template <typename F>
bool wait_for(F cond, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return cond();
}

// ---- the daemon ---------------------------------------------------------------------

class Daemon {
 public:
  explicit Daemon(std::string extra_config = "", bool allow_unregistered = true) {
    static int counter = 0;
    char tmpl[] = "/tmp/quanta-arbiter-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    scope_ = "qat" + std::to_string(getpid()) + "x" + std::to_string(counter++);
    sim_state_ = scope_ + "-sim";
    std::ofstream cfg(dir_ + "/quanta.toml");
    cfg << "[node]\nscope = \"" << scope_ << "\"\ntenant_socket = \"" << tenant_socket()
        << "\"\nadmin_socket = \"" << admin_socket() << "\"\nstate_dir = \"" << dir_
        << "/state\"\nallow_unregistered = " << (allow_unregistered ? "true" : "false") << "\n"
        << extra_config;
  }
  ~Daemon() {
    stop(SIGKILL);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      std::string name = e.path().filename().string();
      if (name.rfind(scope_ + ".", 0) == 0 || name == sim_state_)
        std::filesystem::remove(e.path(), ec);
    }
    std::filesystem::remove_all(dir_, ec);
  }

  void start() {
    pid_ = fork();
    if (pid_ == 0) {
      setenv("SIMGPU_STATE", sim_state_.c_str(), 1);
      setenv("SIMGPU_DEVICES", "2", 1);
      setenv("LD_LIBRARY_PATH", QUANTA_SIM_DIR, 1);
      int null = ::open("/dev/null", O_WRONLY);
      if (getenv("QUANTA_TEST_VERBOSE") == nullptr) dup2(null, 2);
      execl(QUANTA_ARBITER_BIN, "quanta-arbiter", "--config", (dir_ + "/quanta.toml").c_str(),
            "--foreground", "--log-level", "debug", static_cast<char*>(nullptr));
      _exit(127);
    }
    bool up = wait_for(
        [&] {
          try {
            connect_unix(admin_socket(), SOCK_STREAM);
            return true;
          } catch (...) {
            return false;
          }
        },
        5000);
    ASSERT_TRUE(up) << "quanta-arbiter did not open its admin socket";
  }

  void stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

  json admin(const json& req) {
    UniqueFd fd = connect_unix(admin_socket(), SOCK_STREAM);
    std::string line = req.dump() + "\n";
    EXPECT_EQ(::write(fd.get(), line.data(), line.size()), static_cast<ssize_t>(line.size()));
    std::string in;
    char buf[8192];
    while (in.find('\n') == std::string::npos) {
      ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n <= 0) return json{{"ok", false}, {"error", "closed"}};
      in.append(buf, static_cast<size_t>(n));
    }
    return json::parse(in.substr(0, in.find('\n')));
  }

  std::vector<std::string> uuids() {
    std::vector<std::string> out;
    json s = admin({{"cmd", "status"}});
    for (const json& g : s["gpus"]) out.push_back(g["uuid"]);
    return out;
  }

  json tenant_status(pid_t pid) {
    json s = admin({{"cmd", "status"}});
    for (const json& g : s["gpus"]) {
      for (const json& t : g["tenants"]) {
        if (t["pid"] == pid) return t;
      }
    }
    return json();
  }

  UniqueFd connect() { return connect_unix(tenant_socket(), SOCK_SEQPACKET); }

  std::string tenant_socket() const { return dir_ + "/tenant.sock"; }
  std::string admin_socket() const { return dir_ + "/admin.sock"; }
  const std::string& scope() const { return scope_; }
  const std::string& dir() const { return dir_; }

  common::ControlRegion* control(uint32_t gpu) {
    return map_name<common::ControlRegion>("/" + scope_ + ".gpu." + std::to_string(gpu));
  }
  common::PodRegion* pod(uint32_t index) {
    return map_name<common::PodRegion>("/" + scope_ + ".pod." + std::to_string(index));
  }

 private:
  std::string dir_;
  std::string scope_;
  std::string sim_state_;
  pid_t pid_ = 0;
};

// ---- a forked tenant, driven over a pipe -----------------------------------------------

struct ChildReport {
  uint32_t type = 0;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  uint32_t slot = 0;
  uint32_t gpu_index = 0;
  char reason[256] = {};
};

class ChildTenant {
 public:
  ChildTenant(Daemon& daemon, const std::string& pod, const std::string& uuid) {
    int to_child[2];
    int to_parent[2];
    EXPECT_EQ(pipe2(to_child, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(to_parent, O_CLOEXEC), 0);
    pid = fork();
    if (pid == 0) {
      ::close(to_child[1]);
      ::close(to_parent[0]);
      serve(daemon.tenant_socket(), pod, uuid, to_child[0], to_parent[1]);
      _exit(0);
    }
    ::close(to_child[0]);
    ::close(to_parent[1]);
    cmd_ = to_child[1];
    reply_ = to_parent[0];
  }
  ~ChildTenant() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    ::close(cmd_);
    ::close(reply_);
  }
  ChildReport command(char c, uint64_t arg = 0) {
    char msg[9];
    msg[0] = c;
    std::memcpy(msg + 1, &arg, sizeof(arg));
    EXPECT_EQ(::write(cmd_, msg, sizeof(msg)), 9);
    ChildReport r;
    pollfd p{reply_, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return r;
    EXPECT_EQ(::read(reply_, &r, sizeof(r)), static_cast<ssize_t>(sizeof(r)));
    return r;
  }
  void kill_now() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = 0;
  }

  pid_t pid = 0;

 private:
  // The child: a minimal tenant that admits itself and then obeys commands.
  static void serve(const std::string& socket, const std::string& pod, const std::string& uuid,
                    int in, int out) {
    UniqueFd conn;
    int doorbell = -1;
    common::PodRegion* region = nullptr;
    ChildReport last;
    auto admit = [&] {
      last = ChildReport();
      conn = connect_unix(socket, SOCK_SEQPACKET);
      auto h = hello(pod);
      send_with_fds(conn.get(), &h, sizeof(h), {});
      Packet w = receive(conn.get());
      last.type = static_cast<uint32_t>(w.type());
      if (w.type() != MessageType::kWelcome) {
        auto refused = w.as<common::RefusedMessage>();
        std::memcpy(last.reason, refused.reason, sizeof(last.reason));
        return;
      }
      auto welcome = w.as<common::WelcomeMessage>();
      last.pod_index = welcome.pod_index;
      last.proc_index = welcome.proc_index;
      if (region == nullptr) region = map_fd<common::PodRegion>(w.fds[0], true);
      if (doorbell >= 0) ::close(doorbell);
      ::close(w.fds[0]);
      doorbell = w.fds[1];
      auto a = attach(uuid);
      send_with_fds(conn.get(), &a, sizeof(a), {});
      Packet at = receive(conn.get());
      last.type = static_cast<uint32_t>(at.type());
      auto attached = at.as<common::AttachedMessage>();
      last.slot = attached.slot;
      last.gpu_index = attached.gpu_index;
      at.close_fds();
    };
    auto channel = [&]() -> common::GateChannel& {
      return region->procs[last.proc_index].gpus[last.gpu_index];
    };
    auto ring = [&] {
      uint64_t one = 1;
      ssize_t r = ::write(doorbell, &one, sizeof(one));
      (void)r;
    };
    for (;;) {
      char msg[9];
      if (::read(in, msg, sizeof(msg)) != 9) return;
      uint64_t arg;
      std::memcpy(&arg, msg + 1, sizeof(arg));
      switch (msg[0]) {
        case 'H':  // hello + attach (again, after a restart)
          admit();
          break;
        case 'W':  // want the GPU (and look busy so an idle revoke does not interfere)
          channel().inflight_ns.store(1000000);
          channel().last_launch_ns.store(common::monotonic_ns());
          channel().want.store(1);
          ring();
          break;
        case 'M':  // allocate arg bytes in the ledger
          channel().memory_used.fetch_add(arg);
          region->memory_used[last.gpu_index].fetch_add(arg);
          break;
      }
      ssize_t w = ::write(out, &last, sizeof(last));
      (void)w;
    }
  }

  int cmd_ = -1;
  int reply_ = -1;
};

bool holds(common::ControlRegion* c, uint32_t slot) {
  return (c->slots[slot].turn.load() & 1u) != 0;
}

// ---- tests --------------------------------------------------------------------------

TEST(ArbiterDaemon, AdmitsTenantAndPassesRegionsByDescriptor) {
  Daemon d;
  d.start();
  auto uuids = d.uuids();
  ASSERT_EQ(uuids.size(), 2u);

  UniqueFd conn = d.connect();
  send_message(conn.get(), hello("pod-a"));
  Packet w = receive(conn.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);
  ASSERT_EQ(w.fds.size(), 2u) << "Welcome carries [pod region, doorbell]";
  auto welcome = w.as<common::WelcomeMessage>();
  EXPECT_STREQ(welcome.pod_key, "pod-a");
  EXPECT_GE(welcome.arbiter_generation, 1u);
  EXPECT_EQ(fcntl(w.fds[0], F_GETFL) & O_ACCMODE, O_RDWR);
  auto* pod = map_fd<common::PodRegion>(w.fds[0], true);
  ASSERT_NE(pod, nullptr);
  EXPECT_EQ(pod->header.magic, common::kPodMagic);
  EXPECT_EQ(pod->header.version, common::kLayoutVersion);
  EXPECT_STREQ(pod->header.pod_key, "pod-a");
  EXPECT_EQ(pod->procs[welcome.proc_index].pid.load(), static_cast<uint32_t>(getpid()));
  uint64_t one = 1;
  EXPECT_EQ(::write(w.fds[1], &one, sizeof(one)), 8) << "the doorbell is an eventfd";

  send_message(conn.get(), attach(uuids[1]));
  Packet a = receive(conn.get());
  ASSERT_EQ(a.type(), MessageType::kAttached);
  auto attached = a.as<common::AttachedMessage>();
  EXPECT_EQ(attached.gpu_index, 1u);
  EXPECT_EQ(attached.fd_attached, 1u);
  ASSERT_EQ(a.fds.size(), 1u);
  EXPECT_EQ(fcntl(a.fds[0], F_GETFL) & O_ACCMODE, O_RDONLY)
      << "tenants get the control region read-only";
  EXPECT_EQ(map_fd<common::ControlRegion>(a.fds[0], true), nullptr)
      << "a writable mapping must fail";
  auto* control = map_fd<common::ControlRegion>(a.fds[0], false);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->header.magic, common::kControlMagic);
  EXPECT_STREQ(control->header.uuid, uuids[1].c_str());
  EXPECT_EQ(control->slots[attached.slot].pid.load(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(control->slots[attached.slot].pod_index.load(), welcome.pod_index);

  // A second attach of the same GPU on this connection keeps the slot, sends no fd.
  send_message(conn.get(), attach(uuids[1]));
  Packet again = receive(conn.get());
  ASSERT_EQ(again.type(), MessageType::kAttached);
  EXPECT_EQ(again.as<common::AttachedMessage>().slot, attached.slot);
  EXPECT_EQ(again.as<common::AttachedMessage>().fd_attached, 0u);
  EXPECT_TRUE(again.fds.empty());
  w.close_fds();
  a.close_fds();
}

TEST(ArbiterDaemon, RefusesUnregisteredProcessWhenNotAllowed) {
  Daemon d("", /*allow_unregistered=*/false);
  d.start();
  UniqueFd conn = d.connect();
  send_message(conn.get(), hello("pod-a"));
  Packet r = receive(conn.get());
  ASSERT_EQ(r.type(), MessageType::kRefused);
  EXPECT_TRUE(r.fds.empty());
  std::string reason = r.as<common::RefusedMessage>().reason;
  EXPECT_NE(reason.find("allow_unregistered"), std::string::npos) << reason;
  EXPECT_NE(reason.find(std::to_string(getpid())), std::string::npos) << reason;
}

TEST(ArbiterDaemon, RegisteredContainerIsAdmittedByCgroupWithItsPolicy) {
  Daemon d("", /*allow_unregistered=*/false);
  d.start();
  std::string cgroup = cgroup_of(getpid());
  ASSERT_FALSE(cgroup.empty());
  json r = d.admin({{"cmd", "register"},
                    {"container_id", "c1"},
                    {"pod_uid", "u1"},
                    {"pod_name", "web"},
                    {"pod_namespace", "prod"},
                    {"cgroup_path", cgroup},
                    {"policy", {{"weight", "7"}, {"memory-limit", "1Gi"}}}});
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
  UniqueFd conn = d.connect();
  send_message(conn.get(), hello("ignored-claim"));
  Packet w = receive(conn.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);
  EXPECT_STREQ(w.as<common::WelcomeMessage>().pod_key, "prod/web")
      << "the cgroup decides, not the claim";
  send_message(conn.get(), attach(d.uuids()[0]));
  Packet a = receive(conn.get());
  ASSERT_EQ(a.type(), MessageType::kAttached);
  auto* control = map_fd<common::ControlRegion>(a.fds[0], false);
  EXPECT_EQ(control->slots[a.as<common::AttachedMessage>().slot].memory_cap.load(), 1ull << 30);
  json t = d.tenant_status(getpid());
  EXPECT_EQ(t["weight"], 7);
  EXPECT_EQ(t["pod"], "prod/web");

  EXPECT_FALSE(d.admin({{"cmd", "register"},
                        {"container_id", "c2"},
                        {"pod_name", "x"},
                        {"cgroup_path", "/x"},
                        {"policy", {{"weight", "0"}}}})["ok"]
                   .get<bool>());
  EXPECT_TRUE(d.admin({{"cmd", "unregister"}, {"container_id", "c1"}})["ok"].get<bool>());
  w.close_fds();
  a.close_fds();
}

TEST(ArbiterDaemon, AttachToUnmanagedGpuFailsNamingTheManagedOnes) {
  Daemon ok;
  ok.start();
  UniqueFd conn = ok.connect();
  send_message(conn.get(), hello("pod-a"));
  Packet w = receive(conn.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);
  send_message(conn.get(), attach("GPU-not-here"));
  Packet f = receive(conn.get());
  ASSERT_EQ(f.type(), MessageType::kAttachFailed);
  std::string reason = f.as<common::AttachFailedMessage>().reason;
  EXPECT_NE(reason.find("GPU-not-here"), std::string::npos) << reason;
  EXPECT_NE(reason.find(ok.uuids()[0]), std::string::npos) << reason;
  w.close_fds();
}

TEST(ArbiterDaemon, MalformedMessagesDropOnlyThatConnection) {
  Daemon d;
  d.start();
  auto uuids = d.uuids();
  UniqueFd good = d.connect();
  send_message(good.get(), hello("pod-good"));
  Packet w = receive(good.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);

  std::vector<std::vector<unsigned char>> garbage;
  garbage.push_back({1, 2, 3});  // shorter than a header
  {
    auto h = hello("x");
    h.header.magic = 0xdeadbeef;
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&h),
                         reinterpret_cast<unsigned char*>(&h) + sizeof(h));
  }
  {
    auto h = hello("x");
    h.header.version = 99;
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&h),
                         reinterpret_cast<unsigned char*>(&h) + sizeof(h));
  }
  {
    auto h = hello("x");
    h.header.size = 12345;
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&h),
                         reinterpret_cast<unsigned char*>(&h) + sizeof(h));
  }
  {
    auto h = hello("x");
    std::memset(h.claimed_pod, 'A', sizeof(h.claimed_pod));  // no NUL
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&h),
                         reinterpret_cast<unsigned char*>(&h) + sizeof(h));
  }
  {
    auto h = hello("x");
    h.header.type = static_cast<MessageType>(77);
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&h),
                         reinterpret_cast<unsigned char*>(&h) + sizeof(h));
  }
  {
    auto a = attach(uuids[0]);  // attach before hello
    garbage.emplace_back(reinterpret_cast<unsigned char*>(&a),
                         reinterpret_cast<unsigned char*>(&a) + sizeof(a));
  }
  garbage.push_back(std::vector<unsigned char>(1500, 0xff));  // bigger than any message
  for (size_t i = 0; i < garbage.size(); ++i) {
    UniqueFd bad = d.connect();
    ASSERT_TRUE(send_with_fds(bad.get(), garbage[i].data(), garbage[i].size(), {}));
    Packet r = receive(bad.get());
    EXPECT_TRUE(r.closed) << "garbage #" << i << " did not drop its connection";
  }
  ASSERT_TRUE(d.alive());
  send_message(good.get(), attach(uuids[0]));
  Packet a = receive(good.get());
  EXPECT_EQ(a.type(), MessageType::kAttached) << "a good connection suffered from others' garbage";
  w.close_fds();
  a.close_fds();
}

TEST(ArbiterDaemon, KilledHolderLosesGrantWithin50msAndItsMemoryReturns) {
  Daemon d("[scheduler]\nquantum = \"100ms\"\nrevoke_timeout = \"5s\"\nidle_release = \"1s\"\n");
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant holder(d, "pod-holder", uuid);
  ChildTenant other(d, "pod-other", uuid);
  ChildReport h = holder.command('H');
  ChildReport o = other.command('H');
  ASSERT_EQ(h.type, static_cast<uint32_t>(MessageType::kAttached)) << h.reason;
  ASSERT_EQ(o.type, static_cast<uint32_t>(MessageType::kAttached)) << o.reason;
  auto* control = d.control(0);
  auto* pod = d.pod(h.pod_index);
  ASSERT_NE(control, nullptr);
  ASSERT_NE(pod, nullptr);
  holder.command('M', 64 << 20);
  holder.command('W');
  ASSERT_TRUE(wait_for([&] { return holds(control, h.slot); }, 2000))
      << "the lone waiter was not granted";
  other.command('W');
  EXPECT_EQ(pod->memory_used[0].load(), 64u << 20);

  uint64_t killed = common::monotonic_ns();
  holder.kill_now();
  ASSERT_TRUE(wait_for([&] { return holds(control, o.slot); }, 2000));
  uint64_t took = common::monotonic_ns() - killed;
  EXPECT_LT(took, 50 * kNsPerMs) << "grant moved on after " << took / 1000 << " us";
  EXPECT_FALSE(holds(control, h.slot));
  EXPECT_EQ(control->slots[h.slot].pid.load(), 0u) << "the dead process's slot was not freed";
  EXPECT_TRUE(wait_for([&] { return pod->memory_used[0].load() == 0; }, 1000))
      << "the dead process's memory was not returned to the pod ledger";
  EXPECT_EQ(control->header.holder.load(), o.slot);
}

TEST(ArbiterDaemon, StoppedHolderIsPassedOverAfterTimeoutAndReported) {
  Daemon d("[scheduler]\nquantum = \"10ms\"\nrevoke_timeout = \"200ms\"\nidle_release = \"1s\"\n");
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant stuck(d, "pod-stuck", uuid);
  ChildTenant other(d, "pod-other", uuid);
  ChildReport s = stuck.command('H');
  ChildReport o = other.command('H');
  ASSERT_EQ(o.type, static_cast<uint32_t>(MessageType::kAttached)) << o.reason;
  auto* control = d.control(0);
  stuck.command('W');
  ASSERT_TRUE(wait_for([&] { return holds(control, s.slot); }, 2000));
  kill(stuck.pid, SIGSTOP);
  uint64_t asked = common::monotonic_ns();
  other.command('W');
  ASSERT_TRUE(wait_for([&] { return holds(control, o.slot); }, 3000))
      << "the stopped holder was never passed over";
  uint64_t took = common::monotonic_ns() - asked;
  EXPECT_GE(took, 150 * kNsPerMs) << "passed over before revoke_timeout";
  EXPECT_FALSE(holds(control, s.slot)) << "the stopped holder's turn must stay revoked";
  json t = d.tenant_status(stuck.pid);
  EXPECT_EQ(t["revoke_timeouts"], 1) << t.dump();
  EXPECT_EQ(t["state"], "passed-over") << t.dump();
  kill(stuck.pid, SIGCONT);
}

TEST(ArbiterDaemon, RestartReadoptsLiveTenantsAndReclaimsTheDead) {
  Daemon d("[scheduler]\nquantum = \"100ms\"\nidle_release = \"1s\"\nlease = \"200ms\"\n");
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant live(d, "pod-live", uuid);
  ChildTenant dead(d, "pod-dead", uuid);
  ChildReport l = live.command('H');
  ChildReport x = dead.command('H');
  ASSERT_EQ(l.type, static_cast<uint32_t>(MessageType::kAttached)) << l.reason;
  ASSERT_EQ(x.type, static_cast<uint32_t>(MessageType::kAttached)) << x.reason;
  live.command('M', 4096);
  dead.command('M', 8192);
  live.command('W');
  auto* control = d.control(0);
  auto* live_pod = d.pod(l.pod_index);
  auto* dead_pod = d.pod(x.pod_index);
  ASSERT_TRUE(wait_for([&] { return holds(control, l.slot); }, 2000));
  uint64_t generation = control->header.arbiter_generation.load();

  d.stop(SIGKILL);  // a crash: nothing cleaned up
  dead.kill_now();  // dies while no arbiter watches
  EXPECT_TRUE(holds(control, l.slot)) << "the grant must survive the arbiter's death";
  d.start();

  EXPECT_EQ(control->header.arbiter_generation.load(), generation + 1);
  EXPECT_EQ(live_pod->memory_used[0].load(), 4096u) << "the live tenant's ledger must be kept";
  EXPECT_EQ(dead_pod->memory_used[0].load(), 0u) << "the dead tenant's memory must be reclaimed";
  EXPECT_EQ(control->slots[x.slot].pid.load(), 0u);
  EXPECT_TRUE(holds(control, l.slot)) << "an odd turn is a grant the new arbiter keeps";
  EXPECT_GT(control->header.heartbeat_ns.load() + 1000 * kNsPerMs, common::monotonic_ns())
      << "gating must be back within a second";
  json t = d.tenant_status(live.pid);
  ASSERT_FALSE(t.is_null()) << "the live tenant was not re-adopted";
  EXPECT_EQ(t["pod"], "pod-live");
  EXPECT_EQ(t["slot"], l.slot);
  EXPECT_EQ(t["state"], "holding");

  // The tenant reconnects and gets the same pod entry and slot back.
  ChildReport again = live.command('H');
  ASSERT_EQ(again.type, static_cast<uint32_t>(MessageType::kAttached)) << again.reason;
  EXPECT_EQ(again.pod_index, l.pod_index);
  EXPECT_EQ(again.proc_index, l.proc_index);
  EXPECT_EQ(again.slot, l.slot);
}

TEST(ArbiterDaemon, ForgedPodRegionCannotCaptureAnotherPodAcrossRestart) {
  Daemon d;
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant victim(d, "pod-a", uuid);
  ChildTenant forger(d, "pod-b", uuid);
  ChildReport f = forger.command('H');  // first: its region is adopted before the victim's
  ChildReport v = victim.command('H');
  ASSERT_LT(f.pod_index, v.pod_index);
  ASSERT_EQ(v.type, static_cast<uint32_t>(MessageType::kAttached)) << v.reason;
  ASSERT_EQ(f.type, static_cast<uint32_t>(MessageType::kAttached)) << f.reason;
  victim.command('M', 4096);
  auto* victim_pod = d.pod(v.pod_index);
  auto* forged_pod = d.pod(f.pod_index);
  // Everything pod-b can write: claim pod-a's name and list pod-a's process as its own.
  std::strncpy(forged_pod->header.pod_key, "pod-a", sizeof(forged_pod->header.pod_key));
  uint32_t fake = (f.proc_index + 1) % common::kMaxProcsPerPod;
  forged_pod->procs[fake].pid.store(static_cast<uint32_t>(victim.pid));
  forged_pod->procs[fake].gpus[0].memory_used.store(1 << 20);
  d.stop(SIGKILL);
  d.start();
  EXPECT_EQ(victim_pod->memory_used[0].load(), 4096u) << "pod-b's forgery changed pod-a's ledger";
  EXPECT_EQ(forged_pod->procs[fake].pid.load(), 0u) << "the forged entry was adopted";
  EXPECT_STREQ(forged_pod->header.pod_key, "pod-b");
  json t = d.tenant_status(victim.pid);
  EXPECT_EQ(t["pod"], "pod-a") << t.dump();
  EXPECT_EQ(t["slot"], v.slot);
  EXPECT_EQ(d.tenant_status(forger.pid)["pod"], "pod-b");
  // A newcomer of pod-a joins pod-a's region, not the forger's.
  ChildTenant newcomer(d, "pod-a", uuid);
  ChildReport n = newcomer.command('H');
  EXPECT_EQ(n.pod_index, v.pod_index);
}

TEST(ArbiterDaemon, TenantTruncatingItsPodRegionCannotCrashTheArbiter) {
  Daemon d("[scheduler]\nquantum = \"10ms\"\nrevoke_timeout = \"100ms\"\nlease = \"100ms\"\n");
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant vandal(d, "pod-vandal", uuid);
  ChildTenant other(d, "pod-other", uuid);
  ChildReport v = vandal.command('H');
  ChildReport o = other.command('H');
  ASSERT_EQ(o.type, static_cast<uint32_t>(MessageType::kAttached)) << o.reason;
  auto* control = d.control(0);
  vandal.command('W');
  ASSERT_TRUE(wait_for([&] { return holds(control, v.slot); }, 2000));
  // The region fd a tenant holds is O_RDWR, so it can shrink the file under the arbiter.
  std::string name = "/" + d.scope() + ".pod." + std::to_string(v.pod_index);
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  ::close(fd);
  other.command('W');
  EXPECT_TRUE(wait_for([&] { return holds(control, o.slot); }, 3000))
      << "the other pod never got the GPU";
  EXPECT_TRUE(d.alive()) << "the arbiter died of a truncated pod region";
  EXPECT_TRUE(d.admin({{"cmd", "status"}})["ok"].get<bool>());
}

TEST(ArbiterDaemon, HeartbeatFollowsTheLease) {
  Daemon d("[scheduler]\nlease = \"100ms\"\n");
  d.start();
  auto* control = d.control(0);
  ASSERT_NE(control, nullptr);
  EXPECT_EQ(control->header.lease_ns.load(), 100 * kNsPerMs);
  uint64_t first = control->header.heartbeat_ns.load();
  ASSERT_TRUE(wait_for([&] { return control->header.heartbeat_ns.load() != first; }, 1000));
  EXPECT_LT(common::monotonic_ns() - control->header.heartbeat_ns.load(), 60 * kNsPerMs);
  d.stop(SIGTERM);
  EXPECT_EQ(control->header.heartbeat_ns.load(), 0u)
      << "a clean stop must let tenants lapse at once";
}

TEST(ArbiterDaemon, SetChangesPolicyOfRunningPodLive) {
  Daemon d;
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant t(d, "pod-live", uuid);
  ChildReport r = t.command('H');
  ASSERT_EQ(r.type, static_cast<uint32_t>(MessageType::kAttached)) << r.reason;
  json ok = d.admin({{"cmd", "set"},
                     {"pod", "pod-live"},
                     {"values", {{"weight", "9"}, {"memory-limit", "2Gi"}}}});
  ASSERT_TRUE(ok["ok"].get<bool>()) << ok.dump();
  auto* control = d.control(0);
  EXPECT_EQ(control->slots[r.slot].memory_cap.load(), 2ull << 30);
  EXPECT_EQ(d.tenant_status(t.pid)["weight"], 9);
  json bad = d.admin({{"cmd", "set"}, {"pod", "pod-live"}, {"values", {{"priority", "urgent"}}}});
  EXPECT_FALSE(bad["ok"].get<bool>());
  EXPECT_NE(bad["error"].get<std::string>().find("interactive, batch or best-effort"),
            std::string::npos);
  EXPECT_FALSE(d.admin({{"cmd", "frobnicate"}})["ok"].get<bool>());
}

struct Ran {
  int status = -1;
  std::string out;
  std::string err;
};

Ran run(const std::vector<std::string>& argv) {
  char out_path[] = "/tmp/quanta-arbiter-test-out-XXXXXX";
  char err_path[] = "/tmp/quanta-arbiter-test-err-XXXXXX";
  int out = mkstemp(out_path);
  int err = mkstemp(err_path);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Ran r;
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const char* path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  ::close(out);
  ::close(err);
  unlink(out_path);
  unlink(err_path);
  return r;
}

TEST(ArbiterDaemon, QuantactlPrintsStatusAndSetsPolicy) {
  Daemon d;
  d.start();
  std::string uuid = d.uuids()[0];
  ChildTenant t(d, "pod-shown", uuid);
  ASSERT_EQ(t.command('H').type, static_cast<uint32_t>(MessageType::kAttached));
  const std::string ctl = QUANTACTL_BIN;
  Ran table = run({ctl, "--admin-socket", d.admin_socket(), "status"});
  EXPECT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find(uuid), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("pod-shown"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("ACHIEVED"), std::string::npos) << table.out;

  Ran as_json = run({ctl, "--admin-socket", d.admin_socket(), "status", "--json"});
  ASSERT_EQ(as_json.status, 0) << as_json.err;
  json parsed = json::parse(as_json.out);
  EXPECT_EQ(parsed["gpus"][0]["tenants"][0]["pod"], "pod-shown");

  Ran set = run({ctl, "--admin-socket", d.admin_socket(), "set", "pod-shown", "weight=5",
                 "priority=interactive"});
  EXPECT_EQ(set.status, 0) << set.err;
  EXPECT_EQ(d.tenant_status(t.pid)["priority"], "interactive");

  Ran bad = run({ctl, "--admin-socket", d.admin_socket(), "set", "pod-shown", "weight=heavy"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("weight \"heavy\" is not allowed"), std::string::npos) << bad.err;
  Ran not_pair = run({ctl, "--admin-socket", d.admin_socket(), "set", "pod-shown", "weight"});
  EXPECT_EQ(not_pair.status, 1);
  EXPECT_NE(not_pair.err.find("key=value"), std::string::npos) << not_pair.err;
  Ran no_daemon = run({ctl, "--admin-socket", d.dir() + "/nothing.sock", "status"});
  EXPECT_EQ(no_daemon.status, 1);
  EXPECT_NE(no_daemon.err.find("nothing.sock"), std::string::npos) << no_daemon.err;
}

TEST(ArbiterDaemon, RefusesToStartWithBadConfigNamingTheKey) {
  Daemon d("[scheduler]\nquantum = \"soon\"\n");
  int err[2];
  ASSERT_EQ(pipe(err), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err[1], 2);
    execl(QUANTA_ARBITER_BIN, "quanta-arbiter", "--config", (d.dir() + "/quanta.toml").c_str(),
          "--foreground", static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(err[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = ::read(err[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  EXPECT_NE(text.find("quanta.toml:"), std::string::npos) << text;
  EXPECT_NE(text.find("scheduler.quantum"), std::string::npos) << text;
}

}  // namespace
}  // namespace quanta::arbiter
