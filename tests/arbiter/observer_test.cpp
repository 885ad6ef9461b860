// The Observer held by a test: constructed over a node the test builds (built_node.h: a GPU
// with its control region and scheduler, a pod with its region, an admitted process), as the
// arbiter's core constructs it over its own state. What it shows of that node (the view
// behind top and explain, the status, the figures behind /metrics), what it counts
// (refusals), what it remembers across ticks (a pod's last policy) and what its endpoint
// serves are checked without a daemon, a tenant or a socket of the arbiter's.
#include "arbiter/observing/observer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "arbiter/observing/figures.h"
#include "common/clock.h"
#include "tests/arbiter/built_node.h"
#include "tests/support/http.h"

namespace quanta::arbiter {
namespace {

using test_node::BuiltNode;

constexpr SlotId kSlot = 3;
constexpr uint64_t kMemoryUsed = uint64_t{123} << 20;

class ObserverTest : public ::testing::Test {
 protected:
  explicit ObserverTest(const std::string& extra = "") : node_(1, extra) {}

  // The observer, as the core constructs it after start-up.
  Observer& observe() {
    observer_ = std::make_unique<Observer>(node_.loop, node_.observed());
    return *observer_;
  }
  Pod& admit(const std::string& key, const common::Policy& policy = {}) {
    return node_.admit(key, policy, kSlot, kMemoryUsed);
  }

  BuiltNode node_;
  std::unique_ptr<Observer> observer_;  // last: destroyed before what it reads
};

TEST_F(ObserverTest, TheViewNamesTheNodeAndEachTenantWithItsPodSlotAndMemory) {
  common::Policy policy;
  policy.weight = 3;
  admit("team-a/trainer", policy);
  NodeView v = observe().view(common::monotonic_ns());
  EXPECT_EQ(v.scope, node_.scope);
  EXPECT_EQ(v.generation, BuiltNode::kGeneration);
  EXPECT_EQ(v.started_ns, node_.started_ns);
  EXPECT_EQ(v.tenant_connections, 2u);
  EXPECT_EQ(v.self, getpid());
  ASSERT_EQ(v.gpus.size(), 1u);
  const GpuView& g = v.gpus[0];
  EXPECT_EQ(g.uuid, test_node::gpu_uuid(0));
  EXPECT_EQ(g.free_slots, common::kMaxSlotsPerGpu - 1);
  EXPECT_EQ(g.holder, "");
  ASSERT_EQ(g.tenants.size(), 1u);
  EXPECT_EQ(g.tenants[0].slot, kSlot);
  EXPECT_EQ(g.tenants[0].pid, getpid());
  EXPECT_EQ(g.tenants[0].pod, "team-a/trainer");
  EXPECT_EQ(g.tenants[0].memory_used, kMemoryUsed);
  ASSERT_EQ(g.shares.size(), 1u);
  EXPECT_EQ(g.shares[0].tenant.pod, "team-a/trainer");
  EXPECT_EQ(g.shares[0].tenant.weight, 3u);
}

TEST_F(ObserverTest, StatusTellsEachTenantAsItsShimCountsIt) {
  admit("team-a/trainer");
  Observer& o = observe();
  node_.connections = 5;
  const NodeStatus status = o.status(common::monotonic_ns());
  EXPECT_EQ(status.scope, node_.scope);
  EXPECT_EQ(status.generation, BuiltNode::kGeneration);
  EXPECT_EQ(status.tenant_connections, 5u);
  EXPECT_EQ(status.metrics_listen, "");
  ASSERT_EQ(status.gpus.size(), 1u);
  EXPECT_EQ(status.gpus[0].uuid, test_node::gpu_uuid(0));
  ASSERT_EQ(status.gpus[0].tenants.size(), 1u);
  const TenantStatus& t = status.gpus[0].tenants[0];
  EXPECT_EQ(t.pid, getpid());
  EXPECT_EQ(t.pod, "team-a/trainer");
  EXPECT_EQ(t.memory_used, kMemoryUsed);
  EXPECT_FALSE(t.connected);  // no Hello on this node's connections
}

TEST_F(ObserverTest, ItChangesNothingOfTheNodeButTheAccounting) {
  admit("team-a/trainer");
  Observer& o = observe();
  const Gpu& gpu = *node_.gpus[0];
  o.view(common::monotonic_ns());
  o.figures(common::monotonic_ns());
  o.status(common::monotonic_ns());
  o.tick();
  EXPECT_EQ(gpu.slot_pids.size(), 1u);
  EXPECT_EQ(node_.processes.size(), 1u);
  EXPECT_EQ(gpu.region->header.holder.load(), common::kNoSlot);
  EXPECT_FALSE(gpu.sched->drain_requested());
  EXPECT_EQ(node_.pods->find_key("team-a/trainer")->region.channel(0, 0).memory_used.load(),
            kMemoryUsed);
  EXPECT_NE(gpu.accounting.pod("team-a/trainer"), nullptr);
}

TEST_F(ObserverTest, RefusalsAreCountedByTheirKind) {
  Observer& o = observe();
  o.refused("process 41 names no pod: set QUANTA_POD");
  o.refused("process 42 names no pod: set QUANTA_POD");
  o.refused("something else went wrong");
  const NodeView v = o.view(common::monotonic_ns());
  EXPECT_EQ(v.refusals.at("no-pod"), 2u);
  EXPECT_EQ(v.refusals.at("other"), 1u);
  EXPECT_EQ(o.figures(common::monotonic_ns())->refusals.at("no-pod"), 2u);
}

TEST_F(ObserverTest, ATickRemembersAPodsPolicyAfterItsLastProcessLeft) {
  common::Policy policy;
  policy.weight = 5;
  admit("team-b/server", policy);
  Observer& o = observe();  // its first tick sees the pod
  node_.depart();
  ASSERT_EQ(node_.pods->find_key("team-b/server"), nullptr);
  o.tick();
  const NodeView v = o.view(common::monotonic_ns());
  ASSERT_EQ(v.last_policy.count("team-b/server"), 1u) << "explain tells a departed pod's policy";
  EXPECT_EQ(v.last_policy.at("team-b/server").weight, 5u);
  EXPECT_TRUE(v.gpus[0].tenants.empty());
}

TEST_F(ObserverTest, WithoutAListenAddressThereIsNoEndpoint) {
  EXPECT_EQ(observe().metrics_address(), "");
}

class ObserverEndpointTest : public ObserverTest {
 protected:
  ObserverEndpointTest() : ObserverTest("[metrics]\nlisten = \"127.0.0.1:0\"\n") {}
};

TEST_F(ObserverEndpointTest, TheEndpointServesTheFiguresOfTheNodeItObserves) {
  admit("team-a/trainer");
  Observer& o = observe();
  const std::string address = o.metrics_address();
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_EQ(o.status(common::monotonic_ns()).metrics_listen, address);
  // The loop is not running, so the endpoint serves what the constructor's tick published.
  const test_support::HttpAnswer answer = test_support::http_get(address, "/metrics", 5);
  ASSERT_EQ(answer.status, 200) << answer.body;
  const std::string& metrics = answer.body;
  EXPECT_NE(metrics.find("\nquanta_arbiter_generation 7\n"), std::string::npos);
  EXPECT_NE(metrics.find("namespace=\"team-a\",pod=\"trainer\""), std::string::npos);
  EXPECT_NE(metrics.find("UUID=\"" + test_node::gpu_uuid(0) + "\""), std::string::npos);
}

}  // namespace
}  // namespace quanta::arbiter
