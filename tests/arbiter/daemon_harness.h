// The arbiter as a process, for tests: quanta-arbiter started on a temporary config
// (unique scope, sockets in a temp dir, its own simgpu state), spoken to over the real
// tenant and admin sockets from the test and from forked tenant processes, as
// libquanta.so and quantactl would. QUANTA_TEST_ARBITER (a path) runs another
// quanta-arbiter binary, which is how a regression test is shown to fail on old code.
#pragma once

#include <dirent.h>
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

#include "arbiter/loop/death_watch.h"
#include "arbiter/loop/unix_socket.h"
#include "common/clock.h"
#include "common/shm_layout.h"
#include "common/wire.h"
#include "hosted/admin_client.h"
#include "tests/support/temp_dir.h"

namespace quanta::arbiter::testing {

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

inline Packet receive(int fd, int timeout_ms = 3000) {
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
inline void send_message(int fd, const T& m) {
  ASSERT_TRUE(send_with_fds(fd, &m, sizeof(m), {}));
}

inline common::HelloMessage hello(const std::string& pod) {
  common::HelloMessage m{};
  m.header = common::make_header<common::HelloMessage>(MessageType::kHello);
  std::strncpy(m.claimed_pod, pod.c_str(), sizeof(m.claimed_pod) - 1);
  return m;
}

inline common::AttachMessage attach(const std::string& uuid) {
  common::AttachMessage m{};
  m.header = common::make_header<common::AttachMessage>(MessageType::kAttach);
  std::strncpy(m.uuid, uuid.c_str(), sizeof(m.uuid) - 1);
  return m;
}

template <typename T>
inline T* map_fd(int fd, bool writable) {
  void* p =
      mmap(nullptr, sizeof(T), writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<T*>(p);
}

// Regions are memfds: reachable only through a process that holds them. Opens the one
// named `name` among the descriptors of `pid` (the arbiter), -1 when it has none.
inline int open_region_of(pid_t pid, const std::string& name, int flags) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  const std::string want = "/memfd:" + name + " (deleted)";
  const std::string named = "/dev/shm/" + name;  // arbiters before sealed memfds
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int out = -1;
  while (dirent* e = readdir(d)) {
    char link[512] = {};
    const std::string path = dir + "/" + e->d_name;
    if (readlink(path.c_str(), link, sizeof(link) - 1) <= 0 || (want != link && named != link))
      continue;
    out = ::open(path.c_str(), flags | O_CLOEXEC);
    if (out >= 0) break;
  }
  closedir(d);
  return out;
}

template <typename T>
inline T* map_region_of(pid_t pid, const std::string& name, bool writable) {
  int fd = open_region_of(pid, name, writable ? O_RDWR : O_RDONLY);
  if (fd < 0) return nullptr;
  T* p = map_fd<T>(fd, writable);
  ::close(fd);
  return p;
}

// Polls `cond` every 100 us until it holds or `timeout_ms` passes.
template <typename F>
inline bool wait_for(F cond, int timeout_ms) {
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
  }

  // The binary under test: QUANTA_TEST_ARBITER when set (an older build), else this tree's.
  static std::string binary() {
    const char* other = getenv("QUANTA_TEST_ARBITER");
    return other != nullptr ? other : QUANTA_ARBITER_BIN;
  }

  // Environment the arbiter starts with (test switches such as QUANTA_ARBITER_NO_PEERPIDFD).
  void set_env(const std::string& key, const std::string& value) { env_.emplace_back(key, value); }

  void start() {
    const std::string log_path = dir_ + "/arbiter.log";
    const std::string bin = binary();
    pid_ = fork();
    if (pid_ == 0) {
      setenv("SIMGPU_STATE", sim_state_.c_str(), 1);
      setenv("SIMGPU_DEVICES", "2", 1);
      setenv("LD_LIBRARY_PATH", QUANTA_SIM_DIR, 1);
      for (const auto& [k, v] : env_) setenv(k.c_str(), v.c_str(), 1);
      int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (getenv("QUANTA_TEST_VERBOSE") == nullptr) dup2(log, 2);
      execl(bin.c_str(), "quanta-arbiter", "--config", (dir_ + "/quanta.toml").c_str(),
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

  // Through the client quantactl and the hook use: a refusal comes back as the arbiter's
  // error line, a closed or silent socket as an error naming it (5 s for the whole exchange).
  json admin(const json& req) {
    const hosted::AdminReply reply =
        hosted::admin_request(admin_socket(), req, 5'000'000'000, hosted::kStatusAnswerBytes);
    if (reply.outcome != hosted::AdminOutcome::kUnreachable) return reply.response;
    return json{{"ok", false}, {"error", "admin socket unreachable: " + reply.reason}};
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
  const std::string& sim_state() const { return sim_state_; }
  std::string state_file() const { return dir_ + "/state/" + scope_ + ".state.json"; }
  // Everything every run of the arbiter logged.
  std::string log() const {
    std::ifstream in(dir_ + "/arbiter.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // The current arbiter's regions (a restart makes new control regions; pod regions of
  // live tenants carry over).
  common::ControlRegion* control(uint32_t gpu) {
    return map_region_of<common::ControlRegion>(pid_, scope_ + ".gpu." + std::to_string(gpu),
                                                false);
  }
  common::PodRegion* pod(uint32_t index) {
    return map_region_of<common::PodRegion>(pid_, scope_ + ".pod." + std::to_string(index), true);
  }
  pid_t pid() const { return pid_; }

 private:
  test_support::TempDir scratch_{"quanta-arbiter-test"};
  const std::string dir_ = scratch_.path();
  std::string scope_;
  std::string sim_state_;
  std::vector<std::pair<std::string, std::string>> env_;
  pid_t pid_ = 0;
};

// ---- a forked tenant, driven over a pipe -----------------------------------------------

// AttachFailedMessage::action where the wire has it (so these tests also build against
// older trees, to show a regression test failing there).
template <typename M>
uint32_t attach_failed_action(const M& m) {
  if constexpr (requires { m.action; }) {
    return static_cast<uint32_t>(m.action);
  } else {
    return 0;
  }
}

struct ChildReport {
  uint32_t type = 0;
  uint32_t action = 0;  // RefusedMessage::action of a refusal
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  uint32_t slot = 0;
  uint32_t owner = 0;  // the slot's owner word its Attached reply gave
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
        last.action = static_cast<uint32_t>(refused.action);
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
      if (at.type() == MessageType::kAttachFailed) {
        auto failed = at.as<common::AttachFailedMessage>();
        std::memcpy(last.reason, failed.reason, sizeof(last.reason));
        last.action = attach_failed_action(failed);
      }
      auto attached = at.as<common::AttachedMessage>();
      last.slot = attached.slot;
      last.owner = attached.owner;
      last.gpu_index = attached.gpu_index;
      // Like libquanta.so: the control region stays mapped (read-only) for the process's life.
      if (at.type() == MessageType::kAttached && !at.fds.empty())
        map_fd<common::ControlRegion>(at.fds[0], false);
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

inline bool holds(common::ControlRegion* c, uint32_t slot) {
  return (c->slots[slot].turn.load() & 1u) != 0;
}

struct Ran {
  int status = -1;
  std::string out;
  std::string err;
};

inline Ran run(const std::vector<std::string>& argv) {
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

// ---- a cgroup of the test's own ------------------------------------------------------

// A cgroup v2 directory for one test, so registrations can match processes by cgroup.
class TestCgroup {
 public:
  explicit TestCgroup(const std::string& name) {
    std::ifstream mounts("/proc/self/mounts");
    std::string dev, where, type;
    std::string rest;
    while (mounts >> dev >> where >> type && std::getline(mounts, rest)) {
      if (type == "cgroup2") {
        mount_ = where;
        break;
      }
    }
    if (mount_.empty()) return;
    path_ = "/" + name;
    std::error_code ec;
    std::filesystem::create_directory(mount_ + path_, ec);
    if (!std::filesystem::exists(mount_ + path_)) path_.clear();
  }
  ~TestCgroup() {
    if (path_.empty()) return;
    std::ifstream procs(mount_ + path_ + "/cgroup.procs");
    std::vector<pid_t> members;
    for (pid_t p; procs >> p;) members.push_back(p);
    for (pid_t p : members) {
      std::ofstream root(mount_ + "/cgroup.procs");
      root << p << std::flush;
    }
    for (int i = 0; i < 50 && rmdir((mount_ + path_).c_str()) != 0; ++i) usleep(20000);
  }
  bool ok() const { return !path_.empty(); }
  // As /proc/<pid>/cgroup shows it.
  const std::string& path() const { return path_; }
  bool add(pid_t pid) {
    std::ofstream procs(mount_ + path_ + "/cgroup.procs");
    procs << pid << std::flush;
    return static_cast<bool>(procs);
  }

 private:
  std::string mount_;
  std::string path_;
};

// Registers a container of pod `ns/name` for cgroup `cg` with a policy and devices.
inline json register_pod(Daemon& d, const std::string& id, const std::string& ns,
                         const std::string& name, const std::string& cg, const json& policy,
                         const json& devices = nullptr) {
  json req{{"cmd", "register"}, {"container_id", id},  {"pod_uid", id + "-uid"},
           {"pod_name", name},  {"pod_namespace", ns}, {"cgroup_path", cg},
           {"policy", policy}};
  if (!devices.is_null()) req["devices"] = devices;
  return d.admin(req);
}

// The heartbeat's largest age seen while sampling every 2 ms for `ms`: how long the
// arbiter's loop was away (plus lease/4 of its own cadence).
inline uint64_t worst_heartbeat_age_ns(const common::ControlRegion* control, int ms) {
  uint64_t worst = 0;
  const uint64_t end = common::monotonic_ns() + static_cast<uint64_t>(ms) * kNsPerMs;
  while (common::monotonic_ns() < end) {
    const uint64_t now = common::monotonic_ns();
    const uint64_t beat = control->header.heartbeat_ns.load();
    if (beat != 0 && now > beat) worst = std::max(worst, now - beat);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return worst;
}

}  // namespace quanta::arbiter::testing
