// How libquanta.so gets placed and what it does until it is: joining an arbiter that was
// unreachable at first use, refusing CUDA where the node enforces placement, ignoring a
// tenant's loosening variables on an enforcing node, and keeping its own descriptors apart
// from the program's. Real tenants with the shim preloaded, against a private
// quanta-arbiter or a scripted FakeArbiter; node files through with_quanta_etc.
#include <cuda.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>

#include "tests/integration/fake_arbiter.h"
#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

constexpr uint64_t kMi = 1ull << 20;

void touch(const std::string& path) {
  std::ofstream(path) << "go\n";
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

nlohmann::json finished(Child& child, double timeout_s, const std::string& what) {
  const int code = child.wait(timeout_s);
  EXPECT_EQ(code, 0) << what << " stderr:\n" << child.err() << "\nstdout:\n" << child.out();
  const nlohmann::json report = child.json();
  EXPECT_TRUE(report.is_object()) << what << " printed no report: " << child.out();
  return report;
}

uint64_t pod_ledger(const World& world, const std::string& pod) {
  const int index = find_pod_region(world, pod);
  if (index < 0) return 0;
  PodView view(world, static_cast<uint32_t>(index));
  return view.ok() ? view->memory_used[0].load() : 0;
}

#define REQUIRE_NODE_FILES()                                                                 \
  do {                                                                                       \
    if (!World::node_files_supported())                                                      \
      GTEST_SKIP() << "needs root to give the tenant its own /etc/quanta (mount namespace)"; \
  } while (0)

TEST(Placement, ProcessStartedBeforeTheArbiterJoinsItAndIsCappedFromThen) {
  World world(test_name(), ArbiterConfig{.pods = {{"late", 1, "256Mi"}}});
  Env env = world.tenant_env("late", true);
  env["QUANTA_CONTEXT_OVERHEAD"] = "16Mi";
  env["QUANTA_LOG_LEVEL"] = "info";
  const std::string go = world.file("go");
  // 160 MiB taken while nobody can count it; later 128 MiB more would pass the cap.
  Child probe = world.spawn(
      {QUANTA_LINK_PROBE, "join", std::to_string(160 * kMi), std::to_string(128 * kMi), go}, env);
  sleep_ms(500);
  ASSERT_TRUE(probe.running()) << probe.err();
  world.start_arbiter();
  const uint64_t started = monotonic_ns();
  ASSERT_TRUE(eventually(10, [&] { return ControlView(world, 0).ok(); }));
  ControlView view(world, 0);
  const bool admitted =
      eventually(10, [&] { return view.slot_of(probe.pid()) != common::kNoSlot; });
  const uint64_t joined_after = monotonic_ns() - started;
  ASSERT_TRUE(admitted) << "the process never joined the arbiter that came up after it; stderr:\n"
                        << probe.err() << "\narbiter log:\n"
                        << world.arbiter_log();
  RecordProperty("arbiter_up_to_joined_ms", std::to_string(joined_after / 1000000));
  EXPECT_TRUE(eventually(5, [&] { return pod_ledger(world, "late") == (16 + 160) * kMi; }))
      << "memory held before joining was not charged: " << pod_ledger(world, "late") / kMi
      << " MiB";
  // The link thread says so once the join is complete (the probe may not exit before).
  EXPECT_TRUE(eventually(5, [&] { return count(probe.err(), "joined the arbiter at") == 1; }))
      << probe.err();
  touch(go);
  const nlohmann::json report = finished(probe, 30, "late joiner");
  EXPECT_EQ(report.value("before", -1), 0) << report.dump();
  EXPECT_EQ(report.value("after", -1), static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY))
      << "the cap did not apply once joined: " << report.dump();
  EXPECT_EQ(report.value("free_before", -1), 0) << report.dump();
  EXPECT_EQ(report.value("after_free", -1), 0)
      << "freeing the early memory returned nothing: " << report.dump();
  EXPECT_TRUE(eventually(5, [&] { return pod_ledger(world, "late") == 0; }))
      << "ledger left at " << pod_ledger(world, "late");
}

TEST(Placement, ClosedRuleRefusesCudaUntilTheArbiterPlacesTheProcess) {
  REQUIRE_NODE_FILES();
  World world(test_name(), ArbiterConfig{.pods = {{"closed", 1, "1Gi"}}});
  const std::string node =
      "enforce = on\nunplaced = closed\nsocket = " + world.tenant_socket() + "\n";
  Env env = world.tenant_env("closed", true);
  env["QUANTA_CONTEXT_OVERHEAD"] = "16Mi";
  Child probe = world.spawn_on_node(node, "", {QUANTA_LINK_PROBE, "deny", "20"}, env);
  sleep_ms(1000);
  ASSERT_TRUE(probe.running()) << probe.err();
  world.start_arbiter();
  const nlohmann::json report = finished(probe, 30, "closed-rule process");
  EXPECT_EQ(report.value("first", -1), static_cast<int>(CUDA_ERROR_DEVICE_UNAVAILABLE))
      << report.dump();
  EXPECT_GT(report.value("refusals", 0), 0) << report.dump();
  EXPECT_EQ(report.value("last", -1), 0)
      << "never allowed once placed: " << report.dump() << probe.err();
  EXPECT_EQ(report.value("alloc", -1), 0) << report.dump();
  EXPECT_EQ(report.value("launch", -1), 0) << report.dump();
  EXPECT_EQ(count(probe.err(), "CUDA is refused"), 1u) << "one line, once:\n" << probe.err();
}

TEST(Placement, OpenRuleRunsUngatedUntilTheArbiterComes) {
  REQUIRE_NODE_FILES();
  World world(test_name(), ArbiterConfig{.pods = {{"open", 1, ""}}});
  const std::string node =
      "enforce = on\nunplaced = closed-if-capped\nsocket = " + world.tenant_socket() + "\n";
  const std::string container = "pod = ns/open\nmemory_limit = 0\n";
  Child probe = world.spawn_on_node(node, container, {QUANTA_LINK_PROBE, "deny", "20"},
                                    world.tenant_env("open", true));
  const nlohmann::json report = finished(probe, 30, "open-rule process");
  EXPECT_EQ(report.value("first", -1), 0)
      << "an uncapped pod's process was refused: " << report.dump();
  EXPECT_EQ(report.value("launch", -1), 0) << report.dump();
}

TEST(Placement, DenyRefusalRefusesCudaUntilPlaced) {
  World world(test_name());
  FakeArbiter arbiter(world.file("fake.sock"), FakeArbiterScript{.deny_first = 2});
  Env env = world.tenant_env("", true);
  env["QUANTA_SOCKET"] = world.file("fake.sock");
  env["QUANTA_LOG_LEVEL"] = "info";
  Child probe = world.spawn({QUANTA_LINK_PROBE, "deny", "20"}, env);
  const nlohmann::json report = finished(probe, 30, "denied process");
  EXPECT_EQ(report.value("first", -1), static_cast<int>(CUDA_ERROR_DEVICE_UNAVAILABLE))
      << report.dump();
  EXPECT_EQ(report.value("last", -1), 0)
      << "never served once placed: " << report.dump() << probe.err();
  EXPECT_EQ(report.value("alloc", -1), 0) << report.dump();
  EXPECT_EQ(report.value("launch", -1), 0) << report.dump();
  EXPECT_GE(arbiter.hellos(), 3);
  EXPECT_EQ(count(probe.err(), "CUDA is refused"), 1u) << probe.err();
  EXPECT_EQ(count(probe.err(), "placed this process"), 1u) << probe.err();
}

TEST(Placement, ProcessRefusedAfterPlacementGetsNoMoreMemoryOrLaunches) {
  World world(test_name());
  FakeArbiter arbiter(world.file("fake.sock"), FakeArbiterScript{});
  Env env = world.tenant_env("", true);
  env["QUANTA_SOCKET"] = world.file("fake.sock");
  const std::string go = world.file("go");
  Child probe = world.spawn({QUANTA_LINK_PROBE, "revoked", go}, env);
  ASSERT_TRUE(eventually(10, [&] { return arbiter.attaches() > 0; })) << probe.err();
  sleep_ms(200);
  arbiter.refuse_from_now_on(common::RefusedAction::kDeny);
  touch(go);
  const nlohmann::json report = finished(probe, 30, "process refused after placement");
  EXPECT_EQ(report.value("before", -1), 0) << report.dump();
  EXPECT_EQ(report.value("launch_before", -1), 0) << report.dump();
  EXPECT_EQ(report.value("alloc", -1), static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY))
      << report.dump() << probe.err();
  EXPECT_EQ(report.value("launch", -1), static_cast<int>(CUDA_ERROR_DEVICE_UNAVAILABLE))
      << report.dump();
}

TEST(Placement, TenantVariablesCannotLiftAnEnforcingNodesLimits) {
  REQUIRE_NODE_FILES();
  World world(test_name(), ArbiterConfig{.pods = {{"capped", 1, "128Mi"}},
                                         .extra = "[shim]\ncontext_overhead = \"16Mi\"\n"});
  world.start_arbiter();
  const std::string node = "enforce = on\nsocket = " + world.tenant_socket() + "\n";
  Env env = world.tenant_env("capped", true);
  env["QUANTA_DISABLE"] = "1";
  env["QUANTA_COUNT_MANAGED"] = "0";
  env["QUANTA_CONTEXT_OVERHEAD"] = "0";
  env["QUANTA_SOCKET"] = world.file("elsewhere.sock");
  for (const std::string family : {"alloc", "managed"}) {
    Child tenant = world.spawn_on_node(
        node, "",
        {QUANTA_TENANT_BINARY, "--json", "alloc", "--family", family, "--race", "--bytes", "16Mi"},
        env);
    const nlohmann::json report = finished(tenant, 60, family + " racer");
    // 128 MiB cap, 16 MiB context overhead from the arbiter's [shim]: 7 allocations fit.
    EXPECT_EQ(report.value("successes", 0), 7) << family << ": " << report.dump();
    EXPECT_EQ(report.value("oom", 0), 1) << family << ": " << report.dump();
    for (const char* variable :
         {"QUANTA_DISABLE", "QUANTA_COUNT_MANAGED", "QUANTA_CONTEXT_OVERHEAD", "QUANTA_SOCKET"})
      EXPECT_EQ(count(tenant.err(), std::string("ignoring ") + variable), 1u) << tenant.err();
  }
}

TEST(Placement, WelcomeMarkedEnforcedTakesTheArbitersSettingsOverTheTenants) {
  World world(test_name());
  Env env = world.tenant_env("", true);
  env["QUANTA_SOCKET"] = world.file("fake.sock");
  env["QUANTA_CONTEXT_OVERHEAD"] = "0";
  env["QUANTA_COUNT_MANAGED"] = "0";
  for (const bool enforced : {true, false}) {
    FakeArbiter arbiter(world.file("fake.sock"),
                        FakeArbiterScript{.welcome_flags = enforced ? common::kWelcomeEnforced : 0u,
                                          .count_managed = 1,
                                          .context_overhead = 32 * kMi});
    const std::string go = world.file(enforced ? "go.enforced" : "go.open");
    Child probe = world.spawn({QUANTA_LINK_PROBE, "managed", std::to_string(64 * kMi), go}, env);
    const uint64_t expected = enforced ? (32 + 64) * kMi : 0;  // else the variables hold
    EXPECT_TRUE(
        eventually(10, [&] { return arbiter.welcomes() > 0 && arbiter.pod_used() == expected; }))
        << (enforced ? "enforced" : "not enforced") << ": ledger " << arbiter.pod_used() / kMi
        << " MiB\n"
        << probe.err();
    touch(go);
    finished(probe, 30, "managed holder");
  }
}

TEST(Placement, ContextOverheadVariableTakesTheConfigsSizeGrammar) {
  // QUANTA_CONTEXT_OVERHEAD is spelled as [shim] context_overhead is: decimals and decimal
  // suffixes too. Honoured where the node does not enforce, it replaces the arbiter's figure.
  World world(test_name());
  Env env = world.tenant_env("", true);
  env["QUANTA_SOCKET"] = world.file("fake.sock");
  const std::pair<const char*, uint64_t> spellings[] = {{"1.5Mi", 3 * kMi / 2}, {"2M", 2000000}};
  for (const auto& [text, bytes] : spellings) {
    env["QUANTA_CONTEXT_OVERHEAD"] = text;
    FakeArbiter arbiter(world.file("fake.sock"),
                        FakeArbiterScript{.count_managed = 1, .context_overhead = 32 * kMi});
    const std::string go = world.file(std::string("go.") + text);
    Child probe = world.spawn({QUANTA_LINK_PROBE, "managed", std::to_string(64 * kMi), go}, env);
    EXPECT_TRUE(eventually(
        10, [&] { return arbiter.welcomes() > 0 && arbiter.pod_used() == bytes + 64 * kMi; }))
        << text << ": ledger " << arbiter.pod_used() << " bytes\n"
        << probe.err();
    touch(go);
    finished(probe, 30, "managed holder");
    EXPECT_EQ(count(probe.err(), "ignoring QUANTA_CONTEXT_OVERHEAD"), 0u) << probe.err();
  }
}

TEST(Placement, ShimAnsweredInAnotherProtocolNamesBothVersions) {
  // An arbiter of another release (a rollback below the pod's library): the shim says so,
  // with both versions, at the default level, and runs as one the arbiter cannot place.
  World world(test_name());
  Env env = world.tenant_env("", true);
  env["QUANTA_SOCKET"] = world.file("fake.sock");
  const uint32_t other = common::kWireVersion + 1;
  FakeArbiter arbiter(world.file("fake.sock"), FakeArbiterScript{.other_version = other});
  const std::string go = world.file("go");
  Child probe = world.spawn({QUANTA_LINK_PROBE, "managed", std::to_string(kMi), go}, env);
  const std::string said = "the arbiter speaks tenant protocol " + std::to_string(other) +
                           ", this libquanta.so speaks " + std::to_string(common::kWireVersion);
  EXPECT_TRUE(eventually(10, [&] { return probe.err().find(said) != std::string::npos; }))
      << probe.err();
  EXPECT_EQ(arbiter.welcomes(), 0);
  touch(go);
  finished(probe, 30, "managed holder");
}

TEST(Placement, ProgramReusingTheShimsDescriptorNumbersKeepsItsFiles) {
  World world(test_name(), ArbiterConfig{.pods = {{"fds", 1, ""}}});
  world.start_arbiter();
  Child probe = world.spawn({QUANTA_LINK_PROBE, "fds", world.file("app.data")},
                            world.tenant_env("fds", true));
  const nlohmann::json report = finished(probe, 30, "descriptor reuser");
  EXPECT_EQ(report.value("linked", -1), 0) << report.dump();
  EXPECT_GE(report.value("taken", 0), 2)
      << "the shim's socket and doorbell were not found: " << report.dump();
  EXPECT_GT(report.value("lowest", 0), 255)
      << "the shim's descriptors sit among the program's: " << report.dump();
  EXPECT_TRUE(report.value("intact", false))
      << "the shim closed or replaced the program's descriptors: " << report.dump() << probe.err();
  EXPECT_EQ(report.value("size", 0), 8)
      << "the shim wrote into the program's file: " << report.dump();
  EXPECT_EQ(report.value("errors", 1), 0) << report.dump();
}

TEST(Placement, NvmlOnlyProcessSeesThePodsCapWithoutBecomingATenant) {
  World world(test_name(), ArbiterConfig{.pods = {{"viewed", 1, "512Mi"}}});
  world.start_arbiter();
  Child user = world.spawn_tenant({"alloc", "--bytes", "128Mi", "--hold-ms", "20000"}, "viewed",
                                  true, {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}});
  ASSERT_TRUE(eventually(10, [&] { return pod_ledger(world, "viewed") == 144 * kMi; }))
      << "the CUDA process never held its memory: " << pod_ledger(world, "viewed") / kMi << " MiB";
  const std::string go = world.file("go");
  Child smi = world.spawn({QUANTA_NVML_PROBE, go}, world.tenant_env("viewed", true));
  ASSERT_TRUE(eventually(10, [&] { return !smi.out().empty(); })) << smi.err();
  ControlView view(world, 0);
  ASSERT_TRUE(view.ok());
  EXPECT_NE(view.slot_of(user.pid()), common::kNoSlot);
  EXPECT_EQ(view.slot_of(smi.pid()), common::kNoSlot) << "the NVML-only process became a tenant";
  const nlohmann::json report = nlohmann::json::parse(smi.out(), nullptr, false);
  EXPECT_EQ(report.value("result", -1), 0) << smi.out();
  EXPECT_EQ(report.value("total", 0ull), 512 * kMi)
      << "NVML does not show the pod's cap: " << smi.out();
  EXPECT_EQ(report.value("used", 0ull), 144 * kMi) << smi.out();
  EXPECT_EQ(report.value("free", 0ull), (512 - 144) * kMi) << smi.out();
  touch(go);
  EXPECT_EQ(smi.wait(20), 0) << smi.err();
  user.signal(SIGKILL);
}

}  // namespace
}  // namespace quanta::integration
