// quanta-arbiter as a process (tests/arbiter/daemon_harness.h): admission, regions by
// descriptor, scheduling promises, restart, quantactl and config errors.
#include "tests/arbiter/daemon_harness.h"

#include <sys/resource.h>

#include <cerrno>

namespace quanta::arbiter {
namespace {

using namespace quanta::arbiter::testing;

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
  EXPECT_NE(attached.owner, 0u);
  EXPECT_EQ(control->slots[attached.slot].owner.load(), attached.owner);
  EXPECT_EQ(pod->procs[welcome.proc_index].limits[1].slot.load(), attached.slot);

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
  ASSERT_NE(control, nullptr);
  auto* pod = d.pod(w.as<common::WelcomeMessage>().pod_index);
  ASSERT_NE(pod, nullptr);
  EXPECT_EQ(pod->memory_cap[0].load(), 1ull << 30);
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
    if (i == 2) {
      // Another protocol version: told why (a Refused in the arbiter's own version), then
      // dropped.
      EXPECT_EQ(r.type(), MessageType::kRefused) << "a Hello of protocol 99 was not refused";
      r = receive(bad.get());
    }
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
  EXPECT_EQ(control->slots[h.slot].owner.load(), 0u) << "the dead process's slot was not freed";
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
  ASSERT_NE(control, nullptr);
  ASSERT_NE(live_pod, nullptr);
  ASSERT_TRUE(wait_for([&] { return holds(control, l.slot); }, 2000));
  uint64_t generation = control->header.arbiter_generation.load();

  d.stop(SIGKILL);  // a crash: nothing cleaned up
  dead.kill_now();  // dies while no arbiter watches
  EXPECT_TRUE(holds(control, l.slot)) << "the grant must survive the arbiter's death";
  const uint64_t restarted = common::monotonic_ns();
  d.start();
  ::testing::Test::RecordProperty("restart_to_serving_us",
                                  std::to_string((common::monotonic_ns() - restarted) / 1000));

  // A new control region (the old one can never be written again), with the grant in it.
  auto* fresh = d.control(0);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->header.arbiter_generation.load(), generation + 1);
  EXPECT_TRUE(holds(fresh, l.slot)) << "an odd turn is a grant the new arbiter keeps";
  EXPECT_EQ(fresh->slots[l.slot].owner.load(), l.owner) << "the live tenant's slot was not carried over";
  EXPECT_EQ(fresh->slots[x.slot].owner.load(), 0u) << "the dead tenant's slot was carried over";
  EXPECT_GT(fresh->header.heartbeat_ns.load() + 1000 * kNsPerMs, common::monotonic_ns())
      << "gating must be back within a second";
  // The very same pod region (found through the live tenant's mapping), ledger intact.
  EXPECT_EQ(live_pod->memory_used[0].load(), 4096u) << "the live tenant's ledger must be kept";
  auto* again_pod = d.pod(l.pod_index);
  ASSERT_NE(again_pod, nullptr) << "the live pod's region was not re-adopted";
  again_pod->procs[l.proc_index].gpus[0].launches.store(777);
  EXPECT_EQ(live_pod->procs[l.proc_index].gpus[0].launches.load(), 777u)
      << "the re-adopted region is another file than the one the tenant maps";
  json t = d.tenant_status(live.pid);
  ASSERT_FALSE(t.is_null()) << "the live tenant was not re-adopted";
  EXPECT_EQ(t["pod"], "pod-live");
  EXPECT_EQ(t["slot"], l.slot);
  EXPECT_EQ(t["state"], "holding");
  EXPECT_EQ(t["connected"], false);
  EXPECT_TRUE(d.tenant_status(dead.pid).is_null());

  // The tenant reconnects and gets the same pod entry and slot back.
  ChildReport again = live.command('H');
  ASSERT_EQ(again.type, static_cast<uint32_t>(MessageType::kAttached)) << again.reason;
  EXPECT_EQ(again.pod_index, l.pod_index);
  EXPECT_EQ(again.proc_index, l.proc_index);
  EXPECT_EQ(again.slot, l.slot);
  EXPECT_EQ(d.tenant_status(live.pid)["connected"], true);
  // The dead pod's memory went with it: its next process starts from an empty ledger.
  ChildTenant successor(d, "pod-dead", uuid);
  ChildReport s2 = successor.command('H');
  ASSERT_EQ(s2.type, static_cast<uint32_t>(MessageType::kAttached)) << s2.reason;
  auto* successor_pod = d.pod(s2.pod_index);
  ASSERT_NE(successor_pod, nullptr);
  EXPECT_EQ(successor_pod->memory_used[0].load(), 0u);
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
  ChildTenant other(d, "pod-other", uuid);
  ChildReport o = other.command('H');
  ASSERT_EQ(o.type, static_cast<uint32_t>(MessageType::kAttached)) << o.reason;
  // The vandal is this process: it holds the pod region's descriptor, read-write.
  UniqueFd conn = d.connect();
  send_message(conn.get(), hello("pod-vandal"));
  Packet w = receive(conn.get());
  ASSERT_EQ(w.type(), MessageType::kWelcome);
  ASSERT_EQ(w.fds.size(), 2u);
  EXPECT_NE(ftruncate(w.fds[0], 0), 0) << "a tenant could shrink its pod region";
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(w.fds[0], 1 << 30), 0) << "a tenant could grow its pod region";
  // Through a fresh open of the same file, as root in a container could.
  const std::string self = "/proc/self/fd/" + std::to_string(w.fds[0]);
  UniqueFd reopened(::open(self.c_str(), O_RDWR));
  ASSERT_TRUE(reopened);
  EXPECT_NE(ftruncate(reopened.get(), 0), 0);
  EXPECT_NE(fcntl(reopened.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0)
      << "a tenant could seal its pod region against the arbiter's next mapping";
  other.command('W');
  auto* control = d.control(0);
  EXPECT_TRUE(wait_for([&] { return holds(control, o.slot); }, 3000))
      << "the other pod never got the GPU";
  EXPECT_TRUE(d.alive()) << "the arbiter died of a resized pod region";
  EXPECT_TRUE(d.admin({{"cmd", "status"}})["ok"].get<bool>());
  w.close_fds();
}

// The nice value of every thread of the arbiter's (PRIO_PROCESS names one thread by its id).
std::vector<int> nice_of_threads(pid_t pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    errno = 0;
    const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(std::stoul(task.path().filename().string())));
    if (errno == 0) out.push_back(nice);
  }
  return out;
}

TEST(ArbiterDaemon, RunsAllItsThreadsAtTheConfiguredNiceValue) {
  if (geteuid() != 0) GTEST_SKIP() << "a value below 0 needs CAP_SYS_NICE";
  for (const auto& [config, expected] : std::vector<std::pair<std::string, int>>{{"", -10}, {"nice = -3\n", -3}}) {
    Daemon d(config);
    d.start();
    const auto nices = nice_of_threads(d.pid());
    ASSERT_GE(nices.size(), 2u) << "the arbiter and its helper threads";
    for (int nice : nices) EXPECT_EQ(nice, expected) << "config: " << config;
  }
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
  auto* pod = d.pod(r.pod_index);
  ASSERT_NE(pod, nullptr);
  EXPECT_EQ(pod->memory_cap[0].load(), 2ull << 30);
  EXPECT_EQ(d.tenant_status(t.pid)["weight"], 9);
  json bad = d.admin({{"cmd", "set"}, {"pod", "pod-live"}, {"values", {{"priority", "urgent"}}}});
  EXPECT_FALSE(bad["ok"].get<bool>());
  EXPECT_NE(bad["error"].get<std::string>().find("interactive, batch or best-effort"),
            std::string::npos);
  EXPECT_FALSE(d.admin({{"cmd", "frobnicate"}})["ok"].get<bool>());
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
