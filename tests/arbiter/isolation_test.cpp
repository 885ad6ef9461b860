// Isolation against a hostile tenant, one regression test per way it was broken: regions a
// root tenant could write or resize, identity by a stale pid, packets and admin clients
// that stalled the loop, admission that could be exhausted, names that broke saving, a
// state file whose one bad entry made the arbiter trust a region's own claim, and a
// restart that needed an operator. Each test fails against the arbiter before these fixes
// (QUANTA_TEST_ARBITER=<old quanta-arbiter> with this file built in the old tree).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/un.h>

#include "tests/arbiter/daemon_harness.h"
#include "tests/support/child.h"

namespace quanta::arbiter {
namespace {

using namespace quanta::arbiter::testing;

std::string unique(const std::string& what) {
  static int n = 0;
  return "quanta-test-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// ---- regions ---------------------------------------------------------------------------

TEST(ArbiterIsolation, RootTenantCannotMakeTheControlRegionWritableOrResizeIt) {
  Daemon d("[scheduler]\nlease = \"200ms\"\n");
  d.start();
  const std::string uuid = d.uuids()[0];
  ChildTenant victim(d, "pod-victim", uuid);
  ChildReport v = victim.command('H');
  ASSERT_EQ(v.type, static_cast<uint32_t>(MessageType::kAttached)) << v.reason;
  ASSERT_TRUE(d.admin(
      {{"cmd", "set"}, {"pod", "pod-victim"}, {"values", {{"memory-limit", "1Gi"}}}})["ok"]);

  // This process is the attacker: root, holding the control region's descriptor.
  UniqueFd conn = d.connect();
  send_message(conn.get(), hello("pod-evil"));
  Packet w = receive(conn.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);
  send_message(conn.get(), attach(uuid));
  Packet a = receive(conn.get());
  ASSERT_EQ(a.type(), MessageType::kAttached);
  ASSERT_EQ(a.fds.size(), 1u);
  const std::string self = "/proc/self/fd/" + std::to_string(a.fds[0]);
  UniqueFd rw(::open(self.c_str(), O_RDWR));  // root may reopen it read-write...
  if (rw) {
    // ... and must still not be able to write a byte of it.
    void* p = mmap(nullptr, sizeof(common::ControlRegion), PROT_READ | PROT_WRITE, MAP_SHARED,
                   rw.get(), 0);
    EXPECT_EQ(p, MAP_FAILED) << "a writable mapping of the control region";
    if (p != MAP_FAILED) {
      auto* c = static_cast<common::ControlRegion*>(p);
      c->slots[v.slot].owner.store(1);  // what an attacker would do with it: take the slot
    }
    const char byte = 1;
    EXPECT_LT(pwrite(rw.get(), &byte, 1, 64), 0) << "write(2) into the control region";
    EXPECT_NE(fallocate(rw.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0)
        << "punched a hole in the control region";
    EXPECT_NE(ftruncate(rw.get(), 0), 0) << "truncated the control region";
  }
  const void* ro = mmap(nullptr, sizeof(common::ControlRegion), PROT_READ, MAP_SHARED, a.fds[0], 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(mprotect(const_cast<void*>(ro), 4096, PROT_READ | PROT_WRITE), 0)
      << "a read-only mapping was made writable";

  auto* control = d.control(0);
  ASSERT_NE(control, nullptr);
  EXPECT_TRUE(d.alive()) << "the arbiter died (SIGBUS from a truncated region)";
  EXPECT_EQ(control->slots[v.slot].owner.load(), v.owner) << "another pod's slot changed";
  victim.command('W');
  EXPECT_TRUE(wait_for([&] { return holds(control, v.slot); }, 3000)) << "gating stopped";
  w.close_fds();
  a.close_fds();
}

// Every tenant on a GPU maps its control region: it must learn nothing of its neighbours
// there but that their slots are in use and when they hold the GPU. No pid, no pod or
// process index, no cap, quantum or priority of another tenant is in any word of it.
TEST(ArbiterIsolation, TheControlRegionTellsATenantNoNeighboursPidPodOrPolicy) {
  Daemon d;
  d.start();
  const std::string uuid = d.uuids()[0];
  ChildTenant neighbour(d, "pod-neighbour", uuid);
  ChildTenant watcher(d, "pod-watcher", uuid);
  ChildReport n = neighbour.command('H');
  ChildReport w = watcher.command('H');
  ASSERT_EQ(n.type, static_cast<uint32_t>(MessageType::kAttached)) << n.reason;
  ASSERT_EQ(w.type, static_cast<uint32_t>(MessageType::kAttached)) << w.reason;
  constexpr uint64_t kCap = 3ull << 30;
  ASSERT_TRUE(d.admin({{"cmd", "set"},
                       {"pod", "pod-neighbour"},
                       {"values", {{"memory-limit", "3Gi"}, {"priority", "interactive"}}}})["ok"]);
  neighbour.command('W');
  auto* control = d.control(0);
  auto* pod = d.pod(n.pod_index);
  ASSERT_NE(control, nullptr);
  ASSERT_NE(pod, nullptr);
  ASSERT_TRUE(wait_for([&] { return holds(control, n.slot); }, 3000));
  ASSERT_EQ(pod->memory_cap[0].load(), kCap) << "the cap lives in the pod's own region";
  const uint64_t quantum = pod->procs[n.proc_index].limits[0].quantum_ns.load();
  ASSERT_NE(quantum, 0u);

  // Every aligned word of the region as any tenant maps it.
  const auto* words32 = reinterpret_cast<const uint32_t*>(control);
  const auto* words64 = reinterpret_cast<const uint64_t*>(control);
  for (size_t i = 0; i < sizeof(common::ControlRegion) / 4; ++i) {
    ASSERT_NE(words32[i], static_cast<uint32_t>(neighbour.pid)) << "the neighbour's pid at byte " << 4 * i;
    ASSERT_NE(words32[i], static_cast<uint32_t>(watcher.pid)) << "the watcher's pid at byte " << 4 * i;
  }
  for (size_t i = 0; i < sizeof(common::ControlRegion) / 8; ++i) {
    ASSERT_NE(words64[i], kCap) << "the neighbour's cap at byte " << 8 * i;
    ASSERT_NE(words64[i], quantum) << "the neighbour's quantum at byte " << 8 * i;
  }
  // A slot in use holds its turn, an owner word and its quantum's end, and nothing else.
  const common::ControlSlot& slot = control->slots[n.slot];
  EXPECT_NE(slot.owner.load(), 0u);
  for (uint64_t r : slot.reserved) EXPECT_EQ(r, 0u);
  EXPECT_NE(control->slots[n.slot].owner.load(), control->slots[w.slot].owner.load());
}

TEST(ArbiterIsolation, RestartRecoversFromLeftoverBadOrForeignStateByItself) {
  Daemon d;
  // What a crash, an older version or a vandal could leave: named region files that are
  // too small or foreign, and a state file that is not JSON.
  for (const char* kind : {".gpu.0", ".pod.0", ".pod.7"}) {
    const std::string path = "/dev/shm/" + d.scope() + kind;
    std::ofstream f(path);
    f << "garbage";
  }
  std::filesystem::create_directories(d.dir() + "/state");
  {
    std::ofstream f(d.state_file());
    f << "{\"pods\": {\"0\": {\"key\": 7, \"inode\": \"x\"}}, \"registrations\": [5, "
         "{\"cgroup_path\": []}";
  }
  d.start();
  ASSERT_TRUE(d.alive()) << d.log();
  const std::string uuid = d.uuids()[0];
  ChildTenant t(d, "pod-after", uuid);
  ChildReport r = t.command('H');
  EXPECT_EQ(r.type, static_cast<uint32_t>(MessageType::kAttached)) << r.reason;
  // The next restart reads what this one wrote.
  d.stop(SIGKILL);
  d.start();
  EXPECT_EQ(d.tenant_status(t.pid)["pod"], "pod-after");
}

TEST(ArbiterIsolation, OneMalformedStateEntryCostsOnlyThatEntryAndRegionClaimsAreNeverTrusted) {
  Daemon d;
  d.start();
  const std::string uuid = d.uuids()[0];
  ChildTenant forger(d, "pod-b", uuid);
  ChildTenant victim(d, "pod-a", uuid);
  ChildReport f = forger.command('H');  // first: its region has the lower index
  ChildReport v = victim.command('H');
  ASSERT_EQ(f.type, static_cast<uint32_t>(MessageType::kAttached)) << f.reason;
  ASSERT_EQ(v.type, static_cast<uint32_t>(MessageType::kAttached)) << v.reason;
  victim.command('M', 4096);
  auto* victim_pod = d.pod(v.pod_index);
  auto* forged_pod = d.pod(f.pod_index);
  ASSERT_NE(victim_pod, nullptr);
  ASSERT_NE(forged_pod, nullptr);
  std::strncpy(forged_pod->header.pod_key, "pod-a", sizeof(forged_pod->header.pod_key));
  d.stop(SIGKILL);
  // One bad entry among good ones.
  std::ifstream in(d.state_file());
  json state = json::parse(in);
  in.close();
  state["registrations"].push_back({{"container_id", 5}});
  state["pods"]["x9"] = {{"key", "pod-z"}};
  std::ofstream(d.state_file()) << state.dump(2);
  d.start();
  EXPECT_EQ(victim_pod->memory_used[0].load(), 4096u) << "pod-a's ledger changed";
  EXPECT_EQ(d.tenant_status(victim.pid)["pod"], "pod-a");
  EXPECT_EQ(d.tenant_status(forger.pid)["pod"], "pod-b") << "the region's own claim was trusted";
  ChildTenant newcomer(d, "pod-a", uuid);
  EXPECT_EQ(newcomer.command('H').pod_index, v.pod_index)
      << "pod-a's next process joined another region";
}

// ---- identity --------------------------------------------------------------------------

// In a pid namespace of its own (where the test picks which process gets which pid): a
// process connects and dies, its connection stays open in another process, and the victim
// is created with the dead one's pid and admitted into its pod. A Hello on the stale
// connection must get nothing. Runs as the namespace's init; returns "" or what went wrong.
std::string stale_connection_in_namespace(bool fallback) {
  if (mount("proc", "/proc", "proc", 0, nullptr) != 0) return "skip: cannot mount /proc";
  if (access("/proc/sys/kernel/ns_last_pid", W_OK) != 0) return "skip: no ns_last_pid";
  Daemon d("", /*allow_unregistered=*/false);
  if (fallback) d.set_env("QUANTA_ARBITER_NO_PEERPIDFD", "1");
  d.start();
  if (!d.alive()) return "the arbiter did not start: " + d.log();
  TestCgroup victim_cg(unique("victim"));
  if (!victim_cg.ok()) return "skip: no writable cgroup v2";
  json r =
      register_pod(d, "victim-c", "prod", "victim", victim_cg.path(), {{"memory-limit", "1Gi"}});
  if (!r.value("ok", false)) return "register failed: " + r.dump();

  // The attacker's connection, made by a process that then exits.
  UniqueFd stale(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, d.tenant_socket().c_str(), sizeof(addr.sun_path) - 1);
  pid_t connector = fork();
  if (connector == 0) {
    _exit(connect(stale.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(connector, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the connector failed";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  // The victim gets the connector's pid, joins its pod and stays.
  // Threads take pids too: retry until the victim really gets the connector's pid.
  pid_t victim = 0;
  int go[2];
  int admitted[2];
  for (int attempt = 0; attempt < 5 && victim != connector; ++attempt) {
    if (victim > 0) {
      kill(victim, SIGKILL);
      waitpid(victim, nullptr, 0);
    }
    {
      std::ofstream last("/proc/sys/kernel/ns_last_pid");
      last << connector - 1 << std::flush;
    }
    if (pipe(go) != 0 || pipe(admitted) != 0) return "pipe";
    victim = fork();
    if (victim == 0) {
      char c;
      if (::read(go[0], &c, 1) != 1) _exit(1);
      UniqueFd conn = connect_unix(d.tenant_socket(), SOCK_SEQPACKET);
      auto h = hello("");
      send_with_fds(conn.get(), &h, sizeof(h), {});
      Packet p = receive(conn.get());
      // '1', or what it got instead (a refusal's reason, a close, nothing in time).
      std::string verdict = "1";
      if (p.type() == MessageType::kRefused) {
        verdict = "refused: " + std::string(p.as<common::RefusedMessage>().reason);
      } else if (p.type() != MessageType::kWelcome) {
        verdict = p.closed ? "the connection was closed"
                           : p.bytes.empty() ? "no answer in 3 s"
                                             : "message type " +
                                                   std::to_string(static_cast<int>(p.type()));
      }
      ssize_t n = ::write(admitted[1], verdict.data(), verdict.size());
      (void)n;
      ::close(admitted[1]);
      pause();
      _exit(0);
    }
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{victim};
  if (victim != connector) {
    return "skip: the victim got pid " + std::to_string(victim) + ", not " +
           std::to_string(connector);
  }
  victim_cg.add(victim);
  ::close(admitted[1]);
  char c = 'g';
  if (::write(go[1], &c, 1) != 1) return "pipe";
  std::string answer;
  char buf[256];
  for (ssize_t n; (n = ::read(admitted[0], buf, sizeof(buf))) > 0;)
    answer.append(buf, static_cast<size_t>(n));
  if (answer != "1")
    return "the victim was not admitted into its pod (" + answer + "); arbiter log:\n" + d.log();

  auto h = hello("");
  send_with_fds(stale.get(), &h, sizeof(h), {});
  Packet p = receive(stale.get());
  std::string verdict;
  if (p.type() == MessageType::kWelcome) {
    verdict = "a Hello on a dead process's connection was welcomed into pod " +
              std::string(p.as<common::WelcomeMessage>().pod_key) + ", with its region";
  }
  p.close_fds();
  return verdict;
}

// Runs `body` in a forked child and returns the text it wrote back.
template <typename Body>
std::string in_child(Body body) {
  int result[2];
  if (pipe(result) != 0) return "pipe failed";
  pid_t child = fork();
  if (child == 0) {
    ::close(result[0]);
    const std::string text = body();
    ssize_t n = ::write(result[1], text.data(), text.size());
    (void)n;
    _exit(0);
  }
  ::close(result[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = ::read(result[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(result[0]);
  waitpid(child, nullptr, 0);
  return text;
}

// The scenario as init of a new pid namespace (and a private mount namespace for its
// /proc), from a child so the test process keeps its own namespaces.
std::string run_stale_connection_scenario(bool fallback) {
  return in_child([fallback] {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
      return std::string("skip: cannot unshare a pid namespace");
    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    return in_child([fallback] { return stale_connection_in_namespace(fallback); });
  });
}

void expect_stale_connection_refused(bool fallback) {
  // On a loaded machine the victim is now and then not admitted (seen about once in five
  // runs, cause not found yet); such a run proves nothing either way, so it is run again.
  // A stale connection that is welcomed fails at once.
  std::string text;
  for (int run = 0; run < 3; ++run) {
    text = run_stale_connection_scenario(fallback);
    if (text.rfind("the victim was not admitted into its pod", 0) != 0) break;
    std::fprintf(stderr, "run %d: %s\n", run + 1, text.c_str());
  }
  if (text.rfind("skip:", 0) == 0) GTEST_SKIP() << text;
  EXPECT_EQ(text, "");
}

TEST(ArbiterIsolation, AConnectionOfADeadProcessLendsNoIdentityToItsPidsNextOwner) {
  expect_stale_connection_refused(/*fallback=*/false);
}

TEST(ArbiterIsolation, AConnectionOfADeadProcessLendsNoIdentityWithoutPeerPidfds) {
  expect_stale_connection_refused(/*fallback=*/true);
}

// ---- the loop never waits --------------------------------------------------------------

// A TCP socket whose close blocks: unsent data to a peer that never reads, SO_LINGER 20 s.
UniqueFd lingering_tcp_socket(UniqueFd* server_side) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int small = 4096;
  setsockopt(listener.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener.get(), 1) != 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return UniqueFd();
  UniqueFd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  setsockopt(client.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  if (connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return UniqueFd();
  server_side->reset(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  std::vector<char> junk(1 << 16, 'x');
  while (send(client.get(), junk.data(), junk.size(), MSG_DONTWAIT) > 0) {
  }
  linger l{1, 20};
  setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  return client;
}

void expect_descriptors_never_stall_the_loop(bool kernel_refuses) {
  Daemon d("[scheduler]\nlease = \"200ms\"\n");
  if (!kernel_refuses) d.set_env("QUANTA_ARBITER_NO_PASSRIGHTS", "1");
  d.start();
  auto* control = d.control(0);
  ASSERT_NE(control, nullptr);
  UniqueFd server_side;
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 3; ++i) {
    UniqueFd tcp = lingering_tcp_socket(&server_side);
    ASSERT_TRUE(tcp);
    UniqueFd conn = d.connect();
    auto h = hello("pod-linger");
    bool sent = send_with_fds(conn.get(), &h, sizeof(h), {tcp.get()});
    if (!sent) {
      EXPECT_EQ(errno, EPERM) << "the send failed, but not because it was refused";
      linger now{1, 0};  // refused: this copy is the last, so it must not linger here
      setsockopt(tcp.get(), SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    }
    tcp.reset();               // the arbiter's copy, if it has one, is the last
    if (i == 2) conn.reset();  // and one whose queue the arbiter must purge on close
    conns.push_back(std::move(conn));
  }
  const uint64_t worst = worst_heartbeat_age_ns(control, 1500);
  ::testing::Test::RecordProperty("worst_heartbeat_age_us", std::to_string(worst / 1000));
  EXPECT_LT(worst, 150 * kNsPerMs)
      << "the event loop stood still for " << worst / kNsPerMs << " ms";
  EXPECT_TRUE(d.admin({{"cmd", "status"}})["ok"].get<bool>());
}

TEST(ArbiterIsolation, ADescriptorSentWithAPacketNeverStallsTheLoop) {
  expect_descriptors_never_stall_the_loop(/*kernel_refuses=*/true);
}

TEST(ArbiterIsolation, ADescriptorTakenWhereTheKernelCannotRefuseItIsClosedOffTheLoop) {
  expect_descriptors_never_stall_the_loop(/*kernel_refuses=*/false);
}

TEST(ArbiterIsolation, AnAdminClientThatDoesNotReadCannotStallTheLoop) {
  // A stalled loop stood still for seconds; the bound stays under the lease (no tenant's
  // gating lapses) with room for a loaded machine under sanitizers.
  Daemon d("[scheduler]\nlease = \"400ms\"\n");
  d.start();
  auto* control = d.control(0);
  ASSERT_NE(control, nullptr);
  UniqueFd slow = connect_unix(d.admin_socket(), SOCK_STREAM);
  int small = 4096;
  setsockopt(slow.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  std::string requests;
  for (int i = 0; i < 4000; ++i) requests += "{\"cmd\":\"status\"}\n";
  size_t off = 0;
  const uint64_t until = common::monotonic_ns() + 300 * kNsPerMs;
  while (off < requests.size() && common::monotonic_ns() < until) {
    ssize_t n =
        send(slow.get(), requests.data() + off, requests.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0)
      off += static_cast<size_t>(n);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const uint64_t worst = worst_heartbeat_age_ns(control, 2000);
  EXPECT_LT(worst, 300 * kNsPerMs)
      << "the event loop stood still for " << worst / kNsPerMs << " ms";
  const uint64_t asked = common::monotonic_ns();
  EXPECT_TRUE(d.admin({{"cmd", "status"}})["ok"].get<bool>());
  EXPECT_LT(common::monotonic_ns() - asked, 500 * kNsPerMs) << "another admin client waited";
}

// ---- admission -------------------------------------------------------------------------

TEST(ArbiterIsolation, ConnectionsThatNeverSayHelloAreClosedAtTheDeadline) {
  Daemon d;
  d.start();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(d.connect());
  for (UniqueFd& c : idle) {
    Packet p = receive(c.get(), 6000);
    EXPECT_TRUE(p.closed) << "an idle connection was kept past the Hello deadline";
  }
}

TEST(ArbiterIsolation, ConnectionsClosedBeforeTheArbiterReadThemDoNotLockTheirProcessOut) {
  // A process that probes the socket (connect, close) while the loop is busy leaves accepted
  // connections whose close the loop has not read yet. They counted against the process's
  // bound on connections without a Hello, and its next connection was refused.
  Daemon d;
  d.start();
  ASSERT_EQ(kill(d.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_for([&] { return test_support::process_stopped(d.pid()); }, 2000));
  for (int i = 0; i < 6; ++i) d.connect().reset();
  UniqueFd mine = d.connect();
  ASSERT_TRUE(mine);
  send_message(mine.get(), hello("pod-prober"));
  ASSERT_EQ(kill(d.pid(), SIGCONT), 0);
  Packet w = receive(mine.get(), 6000);
  EXPECT_EQ(w.type(), MessageType::kWelcome)
      << "connections this process had already closed locked it out";
  w.close_fds();

  // Connections it keeps open still count: the fifth without a Hello is refused.
  std::vector<UniqueFd> held;
  for (int i = 0; i < 4; ++i) held.push_back(d.connect());
  EXPECT_TRUE(d.admin({{"cmd", "status"}})["ok"].get<bool>());  // the loop accepted them
  UniqueFd fifth = d.connect();
  EXPECT_TRUE(receive(fifth.get(), 3000).closed) << "the bound per process no longer binds";
}

TEST(ArbiterIsolation, AConnectionFloodFromOneCgroupLocksNobodyOut) {
  Daemon d;
  d.start();
  TestCgroup flood_cg(unique("flood"));
  if (!flood_cg.ok()) GTEST_SKIP() << "no writable cgroup v2";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t flooder = fork();
  if (flooder == 0) {
    ::close(ready[0]);
    rlimit files{20000, 20000};
    setrlimit(RLIMIT_NOFILE, &files);
    usleep(100000);  // moved into its cgroup by now
    // Connections made by short-lived processes and kept by this one: a bound per pid
    // alone never binds, and a table that keeps dead pids' connections fills up.
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, d.tenant_socket().c_str(), sizeof(addr.sun_path) - 1);
    std::vector<int> held;
    for (int round = 0; round < 2100; ++round) {
      int fds[4];
      for (int& fd : fds) fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      pid_t connector = fork();
      if (connector == 0) {
        for (int fd : fds) {
          if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(1);
        }
        _exit(0);
      }
      waitpid(connector, nullptr, 0);
      held.insert(held.end(), fds, fds + 4);
    }
    ssize_t n = ::write(ready[1], "x", 1);
    (void)n;
    pause();
    _exit(0);
  }
  ::close(ready[1]);
  flood_cg.add(flooder);
  char done;
  pollfd p{ready[0], POLLIN, 0};
  poll(&p, 1, 60000);
  ASSERT_EQ(::read(ready[0], &done, 1), 1);
  ::close(ready[0]);
  UniqueFd mine = d.connect();
  send_message(mine.get(), hello("pod-legit"));
  Packet w = receive(mine.get());
  EXPECT_EQ(w.type(), MessageType::kWelcome)
      << "a flood from another cgroup locked this tenant out";
  w.close_fds();
  kill(flooder, SIGKILL);
  waitpid(flooder, nullptr, 0);
}

TEST(ArbiterIsolation, APodCannotRaiseItsOwnProcessLimitByEditingItsRegion) {
  Daemon d;
  d.start();
  const std::string uuid = d.uuids()[0];
  std::vector<std::unique_ptr<ChildTenant>> members;
  int welcomed = 0;
  int refused = 0;
  common::PodRegion* region = nullptr;
  for (uint32_t i = 0; i < common::kMaxProcsPerPod + 6; ++i) {
    members.push_back(std::make_unique<ChildTenant>(d, "pod-greedy", uuid));
    ChildReport r = members.back()->command('H');
    if (r.type == static_cast<uint32_t>(MessageType::kRefused)) {
      ++refused;
      continue;
    }
    ++welcomed;
    if (region == nullptr) region = d.pod(r.pod_index);
    ASSERT_NE(region, nullptr);
    // What the pod can write: every process entry marked free again.
    for (auto& e : region->procs) e.pid.store(0);
  }
  EXPECT_EQ(welcomed, static_cast<int>(common::kMaxProcsPerPod));
  EXPECT_EQ(refused, 6) << "the pod's own words raised its process limit";
  EXPECT_TRUE(d.alive());
}

TEST(ArbiterIsolation, ANameThatIsNotUtf8IsRefusedAndEveryoneElseStillGetsIn) {
  Daemon d;
  d.start();
  {
    UniqueFd c = d.connect();
    send_message(c.get(), hello("bad\xff\xfe\x1b[2Jname"));
    Packet r = receive(c.get());
    EXPECT_EQ(r.type(), MessageType::kRefused);
    EXPECT_TRUE(r.fds.empty());
  }
  ChildTenant ok(d, "pod-ok", d.uuids()[0]);
  ChildReport r = ok.command('H');
  EXPECT_EQ(r.type, static_cast<uint32_t>(MessageType::kAttached)) << r.reason;
  std::ifstream in(d.state_file());
  json state = json::parse(in, nullptr, false);
  ASSERT_FALSE(state.is_discarded()) << "the state file is not valid JSON";
  bool found = false;
  for (const auto& [index, pod] : state["pods"].items())
    found = found || pod.dump().find("pod-ok") != std::string::npos;
  EXPECT_TRUE(found) << "pod-ok was not saved: " << state.dump();
  EXPECT_EQ(d.log().find('\x1b'), std::string::npos)
      << "a tenant's escape sequence reached the log";
}

TEST(ArbiterIsolation, LogLinesATenantCanTriggerAreRateLimited) {
  Daemon d;
  d.start();
  for (int i = 0; i < 300; ++i) {
    UniqueFd c = d.connect();
    const char junk[] = "junk";
    send_with_fds(c.get(), junk, sizeof(junk), {});
    receive(c.get(), 1000);
  }
  ASSERT_TRUE(d.alive());
  const std::string log = d.log();
  size_t lines = 0;
  for (size_t at = log.find("dropping tenant connection"); at != std::string::npos;
       at = log.find("dropping tenant connection", at + 1))
    ++lines;
  EXPECT_LE(lines, 60u) << "every bad connection wrote a log line";
  EXPECT_GE(lines, 1u);
}

}  // namespace
}  // namespace quanta::arbiter
