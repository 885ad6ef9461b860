// quantactl drain end to end: real quanta-tenant processes under libquanta.so keep the GPU
// busy, `quantactl drain` must stop every grant on the drained GPU (whole or one MIG
// instance) and say when it is idle, `quantactl undrain` must bring the tenants back with
// no CUDA error, and a restarted arbiter must keep the drain. simgpu's execution log is the
// judge of who ran on which device when. Also what waiting costs the arbiter: a waiter's
// rings, the looks at a busy holder, the rings that replace them, and its wake-ups per switch.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>

#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

std::vector<std::string> batch(double seconds, const std::string& start_at) {
  return {"batch",      "--seconds", std::to_string(seconds), "--kernel-ms", "2", "--depth", "2",
          "--start-at", start_at};
}

// quantactl against this world's arbiter; waits for it to exit.
struct Ctl {
  int code = -1;
  std::string out;
  std::string err;
};
Ctl quantactl(World& world, const std::vector<std::string>& args, double timeout_s = 20) {
  std::vector<std::string> argv = {QUANTACTL_BINARY, "--admin-socket", world.admin_socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child = world.spawn(argv, world.tenant_env("", false));
  Ctl result;
  result.code = child.wait(timeout_s);
  result.out = child.out();
  result.err = child.err();
  return result;
}

nlohmann::json status(World& world) {
  Ctl s = quantactl(world, {"status", "--json"});
  EXPECT_EQ(s.code, 0) << s.err;
  return nlohmann::json::parse(s.out, nullptr, false);
}

// Slices of `pids` on `device` that started within [from, to).
size_t slices_started(const std::vector<Slice>& slices, int device, const std::vector<pid_t>& pids,
                      uint64_t from, uint64_t to) {
  return static_cast<size_t>(std::count_if(slices.begin(), slices.end(), [&](const Slice& s) {
    return s.device == device && std::find(pids.begin(), pids.end(), s.pid) != pids.end() &&
           s.start_ns >= from && s.start_ns < to;
  }));
}

// Waits until every pid in `pids` is admitted on some GPU of the arbiter.
bool admitted(World& world, const std::vector<pid_t>& pids) {
  return eventually(10, [&] {
    nlohmann::json s = status(world);
    size_t found = 0;
    for (const auto& gpu : s["gpus"]) {
      for (const auto& t : gpu["tenants"])
        found += std::count(pids.begin(), pids.end(), t.value("pid", 0));
    }
    return found == pids.size();
  });
}

// Two busy batch tenants of pods "a" and "b" that contend for the GPU: the change of the
// GPU's counters (quantactl status) over `window_ms` after a second of contention.
struct Contention {
  Child a;
  Child b;
  nlohmann::json before;
  nlohmann::json after;
  uint64_t delta(const char* key) const { return after.value(key, 0ull) - before.value(key, 0ull); }
};
void contend(World& world, int window_ms, Contention* out) {
  const std::string at = start_in(300);
  out->a = world.spawn_tenant(batch(4.0, at), "a", true);
  out->b = world.spawn_tenant(batch(4.0, at), "b", true);
  ASSERT_TRUE(admitted(world, {out->a.pid(), out->b.pid()})) << world.arbiter_log();
  sleep_ms(1000);  // both contend
  out->before = status(world)["gpus"][0];
  sleep_ms(window_ms);
  out->after = status(world)["gpus"][0];
}

// A launcher waiting at the gate rings only when it publishes a want the arbiter has not
// seen: the arbiter reads every want at each pass and heartbeat. Reminders once a second
// from each of 64 waiters made the arbiter look at the GPU for nothing new; the undrain's
// own pass grants the waiter without another ring.
TEST(Drain, AWaiterAtADrainedGpuRingsOncePerWait) {
  World world(test_name(), ArbiterConfig{.quantum = "10ms", .pods = {{"a", 1, ""}}});
  world.start_arbiter();
  Child a = world.spawn_tenant(batch(5.0, start_in(300)), "a", true);
  ASSERT_TRUE(admitted(world, {a.pid()})) << world.arbiter_log();
  sleep_ms(500);
  Ctl drain = quantactl(world, {"drain", "0", "--timeout", "10s"});
  ASSERT_EQ(drain.code, 0) << drain.out << drain.err;
  sleep_ms(300);  // the tenant's next launch waits at the gate
  const uint64_t before = status(world)["gpus"][0].value("doorbells", 0ull);
  sleep_ms(3000);
  const uint64_t rang = status(world)["gpus"][0].value("doorbells", 0ull) - before;
  EXPECT_LE(rang, 1u) << "one waiter rang the doorbell " << rang << " times in 3 s";
  nlohmann::json waiting = status(world)["gpus"][0]["tenants"];
  ASSERT_EQ(waiting.size(), 1u) << waiting.dump();
  EXPECT_EQ(waiting[0].value("state", ""), "waiting") << waiting.dump();
  ASSERT_EQ(quantactl(world, {"undrain", "0"}).code, 0);
  expect_clean_exit(a, 30, "tenant a");
}

// A busy holder's shim rings when its queued work runs out (kAttachReportsQuiet), so the
// arbiter looks at it for idleness only then: a contended GPU wakes the arbiter for quanta's
// ends, releases and rings. Before, it looked every idle_release at a holder that was busy
// all along.
TEST(Drain, ABusyHolderIsNotLookedAtWhileItsWorkIsQueued) {
  World world(test_name(), ArbiterConfig{.quantum = "50ms", .pods = {{"a", 1, ""}, {"b", 1, ""}}});
  world.start_arbiter();
  Contention c;
  ASSERT_NO_FATAL_FAILURE(contend(world, 1500, &c));
  const uint64_t looks = c.delta("holder_looks");
  const uint64_t passes = c.delta("passes");
  const uint64_t switches = c.delta("switches");
  const uint64_t rang = c.delta("doorbells");
  EXPECT_GE(switches, 2u) << "the tenants did not take turns";
  // A look or two per grant (the grant's pass read the quiet of the holder's last release);
  // looking every idle_release made about 100 here.
  EXPECT_LE(looks, 2 * switches + 10)
      << "in 1.5 s of contention: " << looks << " looks at the holder, " << passes
      << " full passes, " << switches << " switches";
  // One ring per switch, the release's: the revoked holder back at its gate kept its want
  // through the grant (two per switch when it rang that too).
  EXPECT_LE(rang, switches + switches / 2 + 5)
      << "in 1.5 s of contention: " << rang << " rings for " << switches << " switches";
  expect_clean_exit(c.a, 30, "tenant a");
  expect_clean_exit(c.b, 30, "tenant b");
}

// A switch wakes the arbiter once, at the release: the holder's shim ends its own quantum
// at the end the arbiter published (kAttachEndsOwnQuantum) and releases the next turn ahead
// of the revoke, so the arbiter neither wakes at the quantum's end nor wakes the holder to
// revoke it; it grants the waiter in the pass the release rings for. It used to wake at the
// quantum's end too (and, before that, a third time idle_release after each grant).
TEST(Drain, AContendedGpuWakesTheArbiterOncePerSwitch) {
  World world(test_name(), ArbiterConfig{.quantum = "20ms", .pods = {{"a", 1, ""}, {"b", 1, ""}}});
  world.start_arbiter();
  Contention c;
  ASSERT_NO_FATAL_FAILURE(contend(world, 2000, &c));
  const uint64_t switches = c.delta("switches");
  const uint64_t wakeups = c.delta("passes") + c.delta("holder_looks");
  const uint64_t ended = c.delta("ended_by_holder");
  EXPECT_GE(switches, 20u) << "the tenants did not take turns";
  // A pass that falls past a quantum's end for another reason revokes the holder as before,
  // so not every turn need end by itself; most do.
  EXPECT_GE(ended, switches / 2) << ended << " of " << switches << " turns ended by their holder";
  // One per switch, a heartbeat's every 100 ms (the lease is 400 ms) and the status
  // requests, with room for backstops on a loaded machine: 109 for 87 switches here, and
  // two per switch before (200 for 71 on a loaded machine).
  EXPECT_LE(wakeups, switches + switches / 2 + 30)
      << "in 2 s of contention: " << c.delta("passes") << " passes and " << c.delta("holder_looks")
      << " looks at the holder for " << switches << " switches, " << ended
      << " turns ended by their holder";
  expect_clean_exit(c.a, 30, "tenant a");
  expect_clean_exit(c.b, 30, "tenant b");
}

// The ring is what hands the GPU on: an interactive holder that finished its request is
// revoked for the batch tenant waiting below it a ring and idle_release later. Nothing else
// looks at a holder whose work was queued at the last pass: without the ring the batch
// tenant waited for the next heartbeat or quantum's end (a second here).
TEST(Drain, AHolderWhoseWorkRanOutRingsAndTheWaiterBelowItIsServed) {
  ArbiterConfig config;
  config.quantum = "1s";
  config.idle_release = "2ms";
  config.lease = "4s";  // a heartbeat's pass once a second
  config.extra =
      "quantum_max = \"1s\"\n"  // still [scheduler]: no [pod] table comes before it
      "[pod.\"batch\"]\npriority = \"batch\"\n[pod.\"ia\"]\npriority = \"interactive\"\n";
  World world(test_name(), config);
  world.start_arbiter();
  const std::string at = start_in(400);
  Child busy = world.spawn_tenant(batch(3.0, at), "batch", true);
  Child ia = world.spawn_tenant(
      {"requests", "--rate", "4", "--kernel-ms", "10", "--seconds", "3", "--start-at", at}, "ia",
      true);
  ASSERT_TRUE(admitted(world, {busy.pid(), ia.pid()})) << world.arbiter_log();
  sleep_ms(2600);  // ten requests, each taking the GPU from the batch tenant
  const nlohmann::json gpu = status(world)["gpus"][0];
  expect_clean_exit(busy, 30, "batch tenant");
  expect_clean_exit(ia, 30, "interactive tenant");
  nlohmann::json waiter;
  for (const auto& tenant : gpu["tenants"]) {
    if (tenant.value("pid", 0) == busy.pid()) waiter = tenant;
  }
  ASSERT_TRUE(waiter.is_object()) << gpu.dump();
  EXPECT_GE(waiter.value("gate_waits", 0), 5) << gpu.dump();
  // Each wait is a request's kernel (10 ms) and the handoff after it: about 12 ms here.
  EXPECT_LE(waiter.value("gate_wait_max_ms", 1e9), 300.0)
      << "the batch tenant waited behind a finished request; " << gpu.dump();
}

TEST(Drain, WholeGpuStopsGrantsUntilUndrainAndTenantsSeeNoError) {
  World world(test_name(), ArbiterConfig{.quantum = "10ms", .pods = {{"a", 1, ""}, {"b", 1, ""}}});
  world.start_arbiter();
  const std::string at = start_in(300);
  Child a = world.spawn_tenant(batch(3.0, at), "a", true);
  Child b = world.spawn_tenant(batch(3.0, at), "b", true);
  ASSERT_TRUE(admitted(world, {a.pid(), b.pid()})) << world.arbiter_log();
  sleep_ms(700);  // both contend: the GPU is switching between them

  const uint64_t before_drain = monotonic_ns();
  Ctl drain = quantactl(world, {"drain", "0", "--timeout", "10s"});
  const uint64_t idle_at = monotonic_ns();
  ASSERT_EQ(drain.code, 0) << drain.out << drain.err;
  EXPECT_NE(drain.out.find("is idle"), std::string::npos) << drain.out;
  EXPECT_NE(drain.out.find("2 tenant process(es) still attached"), std::string::npos) << drain.out;
  nlohmann::json drained = status(world);
  EXPECT_TRUE(drained["gpus"][0].value("draining", false));
  EXPECT_TRUE(drained["gpus"][0].value("idle", false));
  EXPECT_TRUE(drained["gpus"][0]["holder"].is_null());

  sleep_ms(600);  // the tenants keep launching: every launch waits at the gate
  const uint64_t undrain_at = monotonic_ns();
  Ctl undrain = quantactl(world, {"undrain", "0"});
  ASSERT_EQ(undrain.code, 0) << undrain.err;
  EXPECT_NE(undrain.out.find("grants resume"), std::string::npos) << undrain.out;

  expect_clean_exit(a, 30, "tenant a");
  expect_clean_exit(b, 30, "tenant b");
  const auto slices = read_sim_log(world.sim_log_path());
  EXPECT_GT(slices_started(slices, 0, {a.pid(), b.pid()}, 0, before_drain), 0u);
  // Once drain reported idle nothing ran until undrain (1 ms for the two clocks' reads).
  EXPECT_EQ(slices_started(slices, 0, {a.pid(), b.pid()}, idle_at + kMs, undrain_at), 0u)
      << "a tenant ran on the drained GPU";
  EXPECT_GT(slices_started(slices, 0, {a.pid()}, undrain_at, UINT64_MAX), 0u)
      << "tenant a did not resume";
  EXPECT_GT(slices_started(slices, 0, {b.pid()}, undrain_at, UINT64_MAX), 0u)
      << "tenant b did not resume";
}

TEST(Drain, MigInstanceByUuidStopsOnlyThatInstance) {
  World world(test_name(),
              ArbiterConfig{.quantum = "10ms", .pods = {{"left", 1, ""}, {"right", 1, ""}}},
              WorldExtras{.sim_env = {{"SIMGPU_MIG", "0:2"}}});
  world.start_arbiter();
  nlohmann::json s = status(world);
  ASSERT_EQ(s["gpus"].size(), 2u) << s.dump();
  const std::string left_uuid = s["gpus"][0]["uuid"];
  const std::string right_uuid = s["gpus"][1]["uuid"];
  ASSERT_EQ(left_uuid.rfind("MIG-", 0), 0u) << left_uuid;

  const std::string at = start_in(300);
  Child left =
      world.spawn_tenant(batch(3.0, at), "left", true, {{"CUDA_VISIBLE_DEVICES", left_uuid}});
  Child left2 =
      world.spawn_tenant(batch(3.0, at), "left", true, {{"CUDA_VISIBLE_DEVICES", left_uuid}});
  Child right =
      world.spawn_tenant(batch(3.0, at), "right", true, {{"CUDA_VISIBLE_DEVICES", right_uuid}});
  ASSERT_TRUE(admitted(world, {left.pid(), left2.pid(), right.pid()}))
      << world.arbiter_log() << left.err();
  sleep_ms(700);

  Ctl drain = quantactl(world, {"drain", left_uuid, "--timeout", "10s"});
  const uint64_t idle_at = monotonic_ns();
  ASSERT_EQ(drain.code, 0) << drain.out << drain.err;
  EXPECT_NE(drain.out.find(left_uuid + " is idle"), std::string::npos) << drain.out;
  nlohmann::json drained = status(world);
  EXPECT_TRUE(drained["gpus"][0].value("draining", false));
  EXPECT_FALSE(drained["gpus"][1].value("draining", true));
  sleep_ms(600);
  const uint64_t undrain_at = monotonic_ns();
  ASSERT_EQ(quantactl(world, {"undrain", left_uuid}).code, 0);

  expect_clean_exit(left, 30, "left tenant");
  expect_clean_exit(left2, 30, "second left tenant");
  expect_clean_exit(right, 30, "right tenant");
  const auto slices = read_sim_log(world.sim_log_path());
  // simgpu logs MIG instances by their device-list index: 0 is the drained one.
  EXPECT_EQ(slices_started(slices, 0, {left.pid(), left2.pid()}, idle_at + kMs, undrain_at), 0u)
      << "a tenant ran on the drained MIG instance";
  EXPECT_GT(slices_started(slices, 1, {right.pid()}, idle_at + kMs, undrain_at), 0u)
      << "the neighbouring MIG instance stopped too";
  EXPECT_GT(slices_started(slices, 0, {left.pid(), left2.pid()}, undrain_at, UINT64_MAX), 0u)
      << "the drained instance's tenants did not resume";
}

TEST(Drain, RestartedArbiterKeepsTheDrain) {
  World world(test_name());
  world.start_arbiter();
  Ctl drain = quantactl(world, {"drain", "0", "--no-wait"});
  ASSERT_EQ(drain.code, 0) << drain.err;
  world.kill_arbiter(SIGTERM);
  world.start_arbiter();
  nlohmann::json s = status(world);
  EXPECT_TRUE(s["gpus"][0].value("draining", false)) << s.dump();
  EXPECT_NE(world.arbiter_log().find("stays drained"), std::string::npos) << world.arbiter_log();

  // A tenant that starts now waits at the gate: no slice until undrain.
  Child t = world.spawn_tenant(batch(1.0, start_in(100)), "", true, {{"QUANTA_POD", "late"}});
  sleep_ms(800);
  const uint64_t undrain_at = monotonic_ns();
  ASSERT_EQ(quantactl(world, {"undrain", "0"}).code, 0);
  expect_clean_exit(t, 30, "tenant started on a drained GPU");
  const auto slices = read_sim_log(world.sim_log_path());
  EXPECT_EQ(slices_started(slices, 0, {t.pid()}, 0, undrain_at), 0u) << "ran before undrain";
  EXPECT_GT(slices_started(slices, 0, {t.pid()}, undrain_at, UINT64_MAX), 0u);
}

TEST(Drain, UnknownGpuIsRefusedWithTheManagedList) {
  World world(test_name());
  world.start_arbiter();
  Ctl drain = quantactl(world, {"drain", "7"});
  EXPECT_EQ(drain.code, 1);
  EXPECT_NE(drain.err.find("managed: 0 GPU-"), std::string::npos) << drain.err;
  Ctl bad_timeout = quantactl(world, {"drain", "0", "--timeout", "soon"});
  EXPECT_EQ(bad_timeout.code, 2) << "a bad duration is a usage error";
  EXPECT_NE(bad_timeout.err.find("--timeout: duration \"soon\" is not allowed"), std::string::npos)
      << bad_timeout.err;
}

}  // namespace
}  // namespace quanta::integration
