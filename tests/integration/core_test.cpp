// Quanta's core promises end to end: real quanta-tenant processes with libquanta.so
// preloaded, one private quanta-arbiter per test, simgpu as the GPU. Every verdict comes
// from what the code under test does not write itself: simgpu's execution log, exit codes
// and reports of the tenants, and the ledger words in the pod regions.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/simgpu/shared_state.h"

namespace quanta::integration {
namespace {

constexpr uint64_t kMi = 1ull << 20;

// The CLOCK_MONOTONIC time (simgpu's log clock) `ms` from now.
uint64_t monotonic_in(double ms) { return monotonic_ns() + static_cast<uint64_t>(ms * 1e6); }

std::vector<std::string> batch(double seconds, const std::string& start_at, double kernel_ms = 2.0) {
  return {"batch", "--seconds", std::to_string(seconds), "--kernel-ms", std::to_string(kernel_ms), "--depth", "2",
          "--start-at", start_at};
}

// Holds of the given pids only, in time order.
std::vector<Hold> holds_among(const std::vector<Slice>& slices, const std::vector<pid_t>& pids) {
  std::vector<Slice> mine;
  for (const Slice& slice : slices) {
    if (std::find(pids.begin(), pids.end(), slice.pid) != pids.end()) mine.push_back(slice);
  }
  return holds_of(mine);
}

// Holds that ended because the GPU went to another tenant (not a tenant's final hold).
std::vector<Hold> interrupted_holds(const std::vector<Hold>& holds, uint64_t from_ns = 0) {
  std::vector<Hold> out;
  for (size_t i = 0; i + 1 < holds.size(); ++i) {
    bool later_hold_of_same_pid = false;
    for (size_t j = i + 1; j < holds.size(); ++j) later_hold_of_same_pid |= holds[j].pid == holds[i].pid;
    if (later_hold_of_same_pid && holds[i].start_ns >= from_ns) out.push_back(holds[i]);
  }
  return out;
}

uint64_t median_length(std::vector<Hold> holds) {
  if (holds.empty()) return 0;
  std::sort(holds.begin(), holds.end(),
            [](const Hold& a, const Hold& b) { return a.end_ns - a.start_ns < b.end_ns - b.start_ns; });
  const Hold& mid = holds[holds.size() / 2];
  return mid.end_ns - mid.start_ns;
}

std::string describe(const std::vector<Hold>& holds) {
  std::string text;
  for (const Hold& hold : holds) {
    text += std::to_string(hold.pid) + ":" + std::to_string((hold.end_ns - hold.start_ns) / 1000) + "us ";
  }
  return text;
}

// Gated with a 20 ms quantum, a tenant keeps the engine to itself for its quantum (10 ms
// leaves room for a revoke landing while its last kernel is still queued); ungated, simgpu
// alternates every 1 ms. One hold in ten may be short: the scheduler rightly passes over a
// holder whose queue runs dry, as it does when a loaded machine starves the holder's
// launching thread of CPU. So the pattern is judged, not each hold.
void expect_holds_of_a_quantum(const std::vector<Hold>& holds, const std::string& what) {
  size_t short_holds = 0;
  for (const Hold& hold : holds) short_holds += hold.end_ns - hold.start_ns < 10 * kMs;
  EXPECT_LE(short_holds * 10, holds.size()) << what << describe(holds);
  EXPECT_GE(median_length(holds), 15 * kMs) << what << describe(holds);
}

// The slot `pid` holds on GPU 0, once the arbiter admitted it.
uint32_t wait_for_slot(const ControlView& control, pid_t pid, double timeout_s = 5) {
  uint32_t slot = common::kNoSlot;
  eventually(timeout_s, [&] { return (slot = control.slot_of(pid)) != common::kNoSlot; });
  return slot;
}

// Watches one pod's ledger word on GPU 0 and keeps the highest value seen.
class LedgerWatch {
 public:
  LedgerWatch(const World& world, const std::string& pod)
      : thread_([this, &world, pod] {
          int index = -1;
          while (!stop_ && (index = find_pod_region(world, pod)) < 0) sleep_ms(1);
          if (index < 0) return;
          PodView view(world, static_cast<uint32_t>(index));
          found_ = view.ok();
          while (!stop_ && view.ok()) {
            const uint64_t used = view->memory_used[0].load();
            max_ = std::max<uint64_t>(max_, used);
            ++samples_;
          }
        }) {}
  ~LedgerWatch() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t max() const { return max_; }
  uint64_t samples() const { return samples_; }
  bool found() const { return found_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> found_{false};
  std::atomic<uint64_t> max_{0};
  std::atomic<uint64_t> samples_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------

TEST(Core, GatedTenantsNeverInterleaveWithinAQuantum) {
  World world(test_name(), ArbiterConfig{.quantum = "20ms", .pods = {{"a", 1, ""}, {"b", 1, ""}}});
  world.start_arbiter();
  const std::string at = start_in(400);
  const uint64_t started = monotonic_in(400);
  Child a = world.spawn_tenant(batch(1.2, at), "a", true);
  Child b = world.spawn_tenant(batch(1.2, at), "b", true);
  expect_clean_exit(a, 20, "gated tenant a");
  expect_clean_exit(b, 20, "gated tenant b");

  // The same pair without the shim, as the baseline that does interleave.
  const std::string native_at = start_in(300);
  Child na = world.spawn_tenant(batch(0.6, native_at), "", false);
  Child nb = world.spawn_tenant(batch(0.6, native_at), "", false);
  expect_clean_exit(na, 20, "native tenant a");
  expect_clean_exit(nb, 20, "native tenant b");

  const auto slices = read_sim_log(world.sim_log_path());
  // From 100 ms after the common start on (before it, one tenant warms up alone).
  const auto gated = interrupted_holds(holds_among(slices, {a.pid(), b.pid()}), started + 100 * kMs);
  const auto native = interrupted_holds(holds_among(slices, {na.pid(), nb.pid()}));
  ASSERT_GE(gated.size(), 10u) << "the gated pair barely alternated: " << describe(gated);
  ASSERT_GE(native.size(), 10u) << "the native pair barely alternated: " << describe(native);
  expect_holds_of_a_quantum(gated, "tenants interleaved within a quantum: ");
  EXPECT_LT(median_length(native), 5 * kMs) << "the baseline did not interleave: " << describe(native);
}

TEST(Core, WeightsOneTwoFourGetSharesWithinFivePoints) {
  World world(test_name(), ArbiterConfig{.quantum = "10ms", .pods = {{"w1", 1, ""}, {"w2", 2, ""}, {"w4", 4, ""}}});
  world.start_arbiter();
  const std::string at = start_in(400);
  Child w1 = world.spawn_tenant(batch(3.0, at), "w1", true);
  Child w2 = world.spawn_tenant(batch(3.0, at), "w2", true);
  Child w4 = world.spawn_tenant(batch(3.0, at), "w4", true);
  expect_clean_exit(w1, 30, "weight 1");
  expect_clean_exit(w2, 30, "weight 2");
  expect_clean_exit(w4, 30, "weight 4");

  const auto slices = read_sim_log(world.sim_log_path());
  // Judge the window in which all three competed: from the last first slice to the first
  // last slice, trimmed by 200 ms at both ends.
  uint64_t from = 0, to = UINT64_MAX;
  for (pid_t pid : {w1.pid(), w2.pid(), w4.pid()}) {
    uint64_t first = UINT64_MAX, last = 0;
    for (const Slice& s : slices) {
      if (s.pid != pid) continue;
      first = std::min(first, s.start_ns);
      last = std::max(last, s.end_ns);
    }
    ASSERT_NE(first, UINT64_MAX) << "pid " << pid << " never ran";
    from = std::max(from, first);
    to = std::min(to, last);
  }
  from += 200 * kMs;
  to -= 200 * kMs;
  ASSERT_GT(to, from + 1000 * kMs) << "the three tenants overlapped for less than 1 s";
  const auto busy = busy_by_pid(slices, from, to);
  double total = 0;
  for (pid_t pid : {w1.pid(), w2.pid(), w4.pid()}) total += static_cast<double>(busy.count(pid) ? busy.at(pid) : 0);
  ASSERT_GT(total, 0);
  const std::pair<pid_t, double> expected[] = {{w1.pid(), 1.0 / 7}, {w2.pid(), 2.0 / 7}, {w4.pid(), 4.0 / 7}};
  for (const auto& [pid, target] : expected) {
    const double share = static_cast<double>(busy.count(pid) ? busy.at(pid) : 0) / total;
    EXPECT_NEAR(share * 100, target * 100, 5.0) << "pid " << pid << " got " << share << ", target " << target;
  }
}

TEST(Core, LoneTenantIsNeverSwitched) {
  World world(test_name(), ArbiterConfig{.quantum = "10ms", .pods = {{"solo", 1, ""}}});
  world.start_arbiter();
  Child solo = world.spawn_tenant(batch(1.0, start_in(200)), "solo", true);
  ASSERT_TRUE(eventually(5, [&] { return ControlView(world, 0).ok(); }));
  ControlView view(world, 0);
  const uint32_t slot = wait_for_slot(view, solo.pid());
  ASSERT_NE(slot, common::kNoSlot) << "the tenant was never admitted; arbiter log:\n" << world.arbiter_log();
  // Sample the turn word for the whole run: granted once, never revoked.
  uint32_t granted_turn = 0;
  std::vector<uint32_t> changes;
  while (solo.running()) {
    if (view->slots[slot].owner.load() == 0) break;  // exiting
    const uint32_t turn = view->slots[slot].turn.load();
    if (turn & 1u) {
      if (granted_turn == 0) granted_turn = turn;
      else if (turn != granted_turn) changes.push_back(turn);
    } else if (granted_turn != 0) {
      changes.push_back(turn);
    }
    sleep_ms(1);
  }
  expect_clean_exit(solo, 20, "lone tenant");
  EXPECT_NE(granted_turn, 0u) << "the lone tenant never held the grant";
  EXPECT_TRUE(changes.empty()) << "the lone tenant's turn changed " << changes.size() << " times after its grant";
}

TEST(Core, EightProcessesOfOnePodNeverExceedTheCap) {
  constexpr uint64_t kCap = 1024 * kMi;
  World world(test_name(), ArbiterConfig{.pods = {{"capped", 1, "1Gi"}, {"neighbour", 1, "2Gi"}}});
  world.start_arbiter();
  LedgerWatch watch(world, "capped");
  const Env overhead = {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}};
  // Every racer makes its context (charged to the pod) before the race starts: nine
  // processes starting at once under a sanitizer on two cores took more than 600 ms, and a
  // racer whose context came after the others filled the cap failed at its context.
  const std::string at = start_in(3000);
  std::vector<Child> racers;
  for (int i = 0; i < 8; ++i) {
    racers.push_back(world.spawn_tenant({"alloc", "--race", "--bytes", "16Mi", "--hold-ms", "400", "--start-at", at},
                                        "capped", true, overhead));
  }
  Child neighbour = world.spawn_tenant(
      {"alloc", "--bytes", "16Mi", "--count", "64", "--hold-ms", "300", "--start-at", at}, "neighbour", true, overhead);
  uint64_t granted = 0;
  for (Child& racer : racers) {
    const nlohmann::json report = expect_clean_exit(racer, 30, "racer");
    EXPECT_EQ(report.value("oom", 0), 1) << report.dump();
    EXPECT_EQ(report.value("error_count", 1), 0) << report.dump();
    granted += report.value("successes", 0ull) * 16 * kMi;
  }
  const nlohmann::json neighbour_report = expect_clean_exit(neighbour, 30, "neighbour");
  EXPECT_EQ(neighbour_report.value("successes", 0), 64) << "the other pod was disturbed: " << neighbour_report.dump();
  EXPECT_EQ(neighbour_report.value("oom", 1), 0) << neighbour_report.dump();
  watch.stop();
  ASSERT_TRUE(watch.found()) << "no pod region for 'capped'";
  EXPECT_GT(watch.samples(), 1000u);
  EXPECT_LE(watch.max(), kCap) << "the pod ledger passed the cap";
  // Every racer stopped at its first denial, so together they filled the cap to within
  // one allocation each (plus their context overheads, also charged).
  EXPECT_LE(granted + 8 * 16 * kMi, kCap);
  EXPECT_GE(granted + 8 * 16 * kMi + 8 * 16 * kMi, kCap) << "the racers never reached the cap";
}

// Starts two batch tenants and waits until `holder_pod`'s process holds the grant while the
// other one waits for it. Returns false (with a failure) if that never happens.
bool wait_for_contention(World& world, ControlView& view, Child& holder, Child& waiter) {
  uint32_t holder_slot = wait_for_slot(view, holder.pid());
  uint32_t waiter_slot = wait_for_slot(view, waiter.pid());
  if (holder_slot == common::kNoSlot || waiter_slot == common::kNoSlot) {
    ADD_FAILURE() << "tenants not admitted; arbiter log:\n" << world.arbiter_log();
    return false;
  }
  const bool seen = eventually(5, [&] {
    return view->header.holder.load() == holder_slot && (view->slots[holder_slot].turn.load() & 1u) &&
           view->header.waiters.load() > 0;
  });
  if (!seen) ADD_FAILURE() << "never saw the holder hold while the other waited";
  return seen;
}

// simgpu keeps each device's model behind one process-shared mutex. A SIGSTOP that lands
// while a process is inside simgpu with that lock held keeps every other process off the
// device until it continues (no lock spans processes in a real driver), so such a stop is
// retried. The owner is glibc's record of the locking thread's id.
bool holds_sim_device_lock(const World& world, pid_t pid) {
  const int fd = shm_open(("/" + world.sim_state()).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  void* map = mmap(nullptr, sizeof(simgpu::SharedState), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return false;
  const int owner = static_cast<const simgpu::SharedState*>(map)->devices[0].lock.__data.__owner;
  munmap(map, sizeof(simgpu::SharedState));
  if (owner == 0) return false;
  std::ifstream task("/proc/" + std::to_string(pid) + "/task/" + std::to_string(owner) + "/stat");
  return task.good();
}

// First slice of `pid` that starts at or after `since`; 0 when none.
uint64_t first_slice_after(const std::vector<Slice>& slices, pid_t pid, uint64_t since) {
  for (const Slice& slice : slices) {
    if (slice.pid == pid && slice.start_ns >= since) return slice.start_ns;
  }
  return 0;
}

TEST(Core, KilledHolderLosesGrantWithin50ms) {
  // Contexts cost memory here, as on a real GPU, so the holder's pod has a charge to lose.
  World world(test_name(), ArbiterConfig{.quantum = "100ms", .pods = {{"holder", 1, "4Gi"}, {"waiter", 1, ""}}},
              WorldExtras{.sim_env = {{"SIMGPU_CONTEXT_MEMORY", "300Mi"}}});
  world.start_arbiter();
  const std::string at = start_in(300);
  Child holder = world.spawn_tenant(batch(5.0, at), "holder", true);
  ASSERT_TRUE(eventually(5, [&] { return ControlView(world, 0).ok(); }));
  ControlView view(world, 0);
  ASSERT_NE(wait_for_slot(view, holder.pid()), common::kNoSlot);
  // The waiter starts once the holder is admitted, so the holder is the first one granted.
  Child waiter = world.spawn_tenant(batch(1.0, start_in(100)), "waiter", true);
  ASSERT_TRUE(wait_for_contention(world, view, holder, waiter));
  const int pod = find_pod_region(world, "holder");
  ASSERT_GE(pod, 0);
  PodView ledger(world, static_cast<uint32_t>(pod));
  ASSERT_GT(ledger->memory_used[0].load(), 0u) << "the holder's context was not charged to its pod; arbiter log:\n" << world.arbiter_log();

  const uint64_t killed_at = monotonic_ns();
  holder.signal(SIGKILL);
  EXPECT_TRUE(eventually(2, [&] { return ledger->memory_used[0].load() == 0; }))
      << "the killed holder's memory stayed in the ledger: " << ledger->memory_used[0].load();
  expect_clean_exit(waiter, 20, "waiter");
  const uint64_t next = first_slice_after(read_sim_log(world.sim_log_path()), waiter.pid(), killed_at);
  ASSERT_NE(next, 0u) << "the waiter never ran after the kill";
  ::testing::Test::RecordProperty("kill_to_next_kernel_us", std::to_string((next - killed_at) / 1000));
  // Promise: 50 ms. CI bound: 150 ms (noisy 2-core machine); quanta-bench measures it.
  EXPECT_LT(next - killed_at, 150 * kMs) << "the waiter's next kernel started " << (next - killed_at) / kMs
                                         << " ms after the holder was killed";
}

TEST(Core, StoppedHolderIsPassedOverAfterTimeout) {
  World world(test_name(),
              ArbiterConfig{.quantum = "20ms", .revoke_timeout = "200ms", .pods = {{"holder", 1, ""}, {"waiter", 1, ""}}});
  world.start_arbiter();
  Child holder = world.spawn_tenant(batch(2.0, start_in(300)), "holder", true);
  ASSERT_TRUE(eventually(5, [&] { return ControlView(world, 0).ok(); }));
  ControlView view(world, 0);
  ASSERT_NE(wait_for_slot(view, holder.pid()), common::kNoSlot);
  Child waiter = world.spawn_tenant(batch(1.0, start_in(100)), "waiter", true);
  const uint32_t holder_slot = view.slot_of(holder.pid());
  // Stop the holder while it holds an unrevoked grant (odd turn after the stop): then only
  // the revoke timeout can hand the GPU on. A stop that lands just after a revoke, or inside
  // simgpu's device lock, is retried.
  uint64_t stopped_at = 0;
  for (int attempt = 0; attempt < 5 && stopped_at == 0; ++attempt) {
    ASSERT_TRUE(wait_for_contention(world, view, holder, waiter));
    const uint64_t now = monotonic_ns();
    holder.signal(SIGSTOP);
    ASSERT_TRUE(eventually(2, [&] { return process_stopped(holder.pid()); }));
    if ((view->slots[holder_slot].turn.load() & 1u) &&
        !holds_sim_device_lock(world, holder.pid())) {
      stopped_at = now;
    } else {
      holder.signal(SIGCONT);
    }
  }
  ASSERT_NE(stopped_at, 0u) << "never caught the holder stopped while holding";
  ASSERT_TRUE(eventually(3, [&] { return first_slice_after(read_sim_log(world.sim_log_path()), waiter.pid(),
                                                           stopped_at + 5 * kMs) != 0; }))
      << "the waiter never ran while the holder was stopped; arbiter log:\n" << world.arbiter_log();
  const uint64_t next = first_slice_after(read_sim_log(world.sim_log_path()), waiter.pid(), stopped_at + 5 * kMs);
  ::testing::Test::RecordProperty("stop_to_next_kernel_us", std::to_string((next - stopped_at) / 1000));
  // Quantum (20 ms) + revoke timeout (200 ms), with slack for a loaded machine.
  EXPECT_GE(next - stopped_at, 150 * kMs) << "the waiter ran before the revoke timeout";
  EXPECT_LT(next - stopped_at, (20 + 200 + 400) * kMs) << "passed over only after " << (next - stopped_at) / kMs << " ms";
  holder.signal(SIGCONT);
  expect_clean_exit(waiter, 20, "waiter");
  expect_clean_exit(holder, 20, "resumed holder");
}

TEST(Core, ArbiterRestartUnderLoadCausesNoTenantError) {
  constexpr uint64_t kCap = 256 * kMi;
  World world(test_name(), ArbiterConfig{.quantum = "20ms",
                                         .lease = "300ms",
                                         .pods = {{"a", 1, ""}, {"b", 1, ""}, {"capped", 1, "256Mi"}}});
  world.start_arbiter();
  LedgerWatch watch(world, "capped");
  const Env overhead = {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}};
  const std::string at = start_in(400);
  const Env chatty = {{"QUANTA_LOG_LEVEL", "info"}};
  // 5 s: under sanitizers holds stretch to ~100 ms and the restarted arbiter takes longer to
  // start (it measures a context's cost first), and several holds must follow the restart.
  Child a = world.spawn_tenant(batch(5.0, at), "a", true, chatty);
  Child b = world.spawn_tenant(batch(5.0, at), "b", true, chatty);
  std::vector<Child> allocators;
  for (int i = 0; i < 2; ++i) {
    allocators.push_back(world.spawn_tenant(
        {"alloc", "--bytes", "128Mi", "--count", "250", "--free", "--hold-ms", "10", "--start-at", at}, "capped", true,
        overhead));
  }
  sleep_ms(400 + 900);
  world.kill_arbiter(SIGKILL);
  sleep_ms(500);  // longer than the lease: the tenants' gating lapses and they run on
  const uint64_t restarting_at = monotonic_ns();
  world.start_arbiter();
  const uint64_t restarted_at = monotonic_ns();
  // Gating resumes for a tenant when it has reconnected and re-attached to the new control
  // region: measured from the restart, for the record.
  {
    const bool back = eventually(5, [&] {
      const nlohmann::json status = world.admin({{"cmd", "status"}});
      int connected = 0;
      for (const auto& gpu : status.value("gpus", nlohmann::json::array()))
        for (const auto& t : gpu["tenants"])
          connected += (t["pid"] == a.pid() || t["pid"] == b.pid()) && t.value("connected", false);
      return connected == 2;
    });
    const uint64_t reattached_at = monotonic_ns();
    EXPECT_TRUE(back) << "the tenants never re-attached; arbiter log:\n" << world.arbiter_log();
    ::testing::Test::RecordProperty("restart_to_serving_ms", std::to_string((restarted_at - restarting_at) / kMs));
    ::testing::Test::RecordProperty("restart_to_reattached_ms", std::to_string((reattached_at - restarting_at) / kMs));
    // 1 s on an idle machine (see the recorded property); 3 s leaves room for a loaded one.
    EXPECT_LT(reattached_at - restarting_at, 3000 * kMs) << "gating was not back within 3 s of the restart";
  }

  expect_clean_exit(a, 30, "tenant a");
  expect_clean_exit(b, 30, "tenant b");
  for (Child* tenant : {&a, &b}) {
    const std::string err = tenant->err();
    EXPECT_NE(err.find("lapsed"), std::string::npos) << "no lease lapse seen by pid " << tenant->pid() << ":\n" << err;
    EXPECT_NE(err.find("reconnected to the arbiter"), std::string::npos)
        << "pid " << tenant->pid() << " never reconnected:\n" << err;
  }
  uint64_t denials = 0;
  for (Child& allocator : allocators) {
    const nlohmann::json report = expect_clean_exit(allocator, 30, "allocating tenant");
    EXPECT_EQ(report.value("error_count", 1), 0) << report.dump();
    denials += report.value("oom", 0ull);
  }
  watch.stop();
  EXPECT_LE(watch.max(), kCap) << "the cap did not hold across the arbiter restart";
  EXPECT_GT(denials, 0u) << "the allocators never met the cap, so it was not exercised";

  // Gating is back within 1 s of the restart: after that, no interleaving within a quantum.
  const auto slices = read_sim_log(world.sim_log_path());
  const auto after = interrupted_holds(holds_among(slices, {a.pid(), b.pid()}), restarted_at + 1000 * kMs);
  ASSERT_GE(after.size(), 5u) << "the tenants barely alternated after the restart: " << describe(after);
  // The re-adopted scheduler may also cut a single hold short (its own policy).
  expect_holds_of_a_quantum(after, "gating not back 1 s after the restart: ");
}

TEST(Core, ProcessWithoutCudaPaysNothing) {
  World world(test_name(), ArbiterConfig{.pods = {{"idle", 1, ""}}});
  world.start_arbiter();
  Env env = world.tenant_env("idle", true);
  env["QUANTA_LOG_LEVEL"] = "debug";
  Child probe = world.spawn({QUANTA_NO_CUDA_PROBE}, env);
  ASSERT_EQ(probe.wait(10), 0) << probe.err();
  const nlohmann::json report = probe.json();
  ASSERT_TRUE(report.is_object()) << probe.out();
  EXPECT_EQ(report.value("threads", -1), 1) << "the shim started a thread in a process that never called CUDA";
  EXPECT_EQ(report.value("sockets", -1), 0) << "the shim opened a socket in a process that never called CUDA";
  EXPECT_EQ(report.value("shim_loaded", false), true) << "the probe ran without the shim preloaded";
  EXPECT_EQ(probe.err(), "") << "the shim logged in a process that never called CUDA";
}

TEST(Core, ThreadsRacingTheFirstConnectionAreAllCapped) {
  World world(test_name(), ArbiterConfig{.pods = {{"threads", 1, "160Mi"}}});
  world.start_arbiter();
  // No context overhead: the threads' allocations are the process's first ledger calls, so
  // they race the shim's first connection. Cap: exactly 10 of the 32 allocations of 16 MiB.
  Env env = world.tenant_env("threads", true);
  env["QUANTA_CONTEXT_OVERHEAD"] = "0";
  Child probe = world.spawn({QUANTA_LINK_PROBE, "threads"}, env);
  ASSERT_EQ(probe.wait(20), 0) << probe.err();
  const nlohmann::json report = probe.json();
  ASSERT_TRUE(report.is_object()) << probe.out();
  EXPECT_EQ(report.value("successes", -1), 10) << "threads that raced the first connection went uncapped: " << report.dump();
  EXPECT_EQ(report.value("oom", -1), 22) << report.dump();
  EXPECT_EQ(report.value("errors", -1), 0) << report.dump();
}

TEST(Core, ForkedChildLinksAsANewProcess) {
  World world(test_name(), ArbiterConfig{.pods = {{"forks", 1, ""}}});
  world.start_arbiter();
  Child probe = world.spawn({QUANTA_LINK_PROBE, "fork"}, world.tenant_env("forks", true));
  ASSERT_EQ(probe.wait(20), 0) << probe.err();
  nlohmann::json child, parent;
  std::istringstream lines(probe.out());
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json object = nlohmann::json::parse(line, nullptr, false);
    if (object.is_object() && object.value("role", "") == "child") child = object;
    if (object.is_object() && object.value("role", "") == "parent") parent = object;
  }
  ASSERT_TRUE(child.is_object() && parent.is_object()) << probe.out() << probe.err();
  // The parent is linked: its link thread, its GPU's device thread and its connection.
  EXPECT_EQ(parent.value("alloc", -1), 0);
  EXPECT_EQ(parent.value("threads", -1), 3) << parent.dump();
  EXPECT_EQ(parent.value("sockets", -1), 1) << parent.dump();
  // The child starts with no link (not the parent's connection, no thread) ...
  EXPECT_EQ(child.value("threads_after_fork", -1), 1) << child.dump();
  EXPECT_EQ(child.value("sockets_after_fork", -1), 0) << "the child kept the parent's arbiter connection";
  // ... and links as a process of its own at its first CUDA call.
  EXPECT_EQ(child.value("alloc", -1), 0) << child.dump();
  EXPECT_EQ(child.value("threads", -1), 3) << child.dump();
  EXPECT_EQ(child.value("sockets", -1), 1) << child.dump();
  // The parent's link is undisturbed by the child's life and exit.
  EXPECT_EQ(parent.value("child_exit", -1), 0);
  EXPECT_EQ(parent.value("alloc_after_child", -1), 0) << parent.dump();
}

TEST(Core, UnregisteredProcessIsRefusedAndRunsUngated) {
  World world(test_name(), ArbiterConfig{.allow_unregistered = false, .pods = {}});
  world.start_arbiter();
  Child tenant = world.spawn_tenant(batch(0.5, start_in(100)), "stranger", true, {{"QUANTA_LOG_LEVEL", "warn"}});
  const nlohmann::json report = expect_clean_exit(tenant, 20, "unregistered tenant");
  EXPECT_GT(report.value("kernels", 0), 100) << "the refused tenant did not run its kernels";
  const std::string err = tenant.err();
  size_t refusals = 0;
  for (size_t at = err.find("refused"); at != std::string::npos; at = err.find("refused", at + 1)) ++refusals;
  EXPECT_EQ(refusals, 1u) << "expected one refusal line on stderr, got:\n" << err;
}

}  // namespace
}  // namespace quanta::integration
