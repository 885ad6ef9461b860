// The AdminService held by a test: constructed over a node the test builds (built_node.h) with
// an Observer and a NodeControl that records what the service asks of the core. Each admin
// request is sent as a client sends it (handle_admin), and the test checks the answer, the
// registry and the drain file the service changed, and exactly which calls reached the core:
// a policy change for a pod with a region, a drain, and nothing for a request it refused.
#include "arbiter/serving/admin_service.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arbiter/observing/observer.h"
#include "tests/arbiter/built_node.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;
using test_node::BuiltNode;
using test_node::gpu_uuid;

// The core as the service sees it: each call written down; a drain applied to the scheduler,
// as the core applies it (without the decision pass).
class RecordingControl : public NodeControl {
 public:
  explicit RecordingControl(BuiltNode& node) : node_(node) {}
  void policy_changed(const std::string& pod_key) override { calls.push_back("policy " + pod_key); }
  void set_draining(uint32_t gpu_index, bool on) override {
    calls.push_back((on ? "drain " : "undrain ") + std::to_string(gpu_index));
    node_.gpus.at(gpu_index)->sched->set_draining(on);
  }
  std::vector<std::string> calls;

 private:
  BuiltNode& node_;
};

class AdminServiceTest : public ::testing::Test {
 protected:
  AdminServiceTest()
      : node_(2, "[pod.\"team/trainer\"]\nweight = 2\n"),
        observer_(node_.loop, node_.observed()),
        control_(node_),
        service_(node_.config, *node_.pods, node_.gpus, node_.node_gpus, observer_, control_) {}

  json ask(const json& request) { return service_.handle_admin(request); }
  static json registration(const std::string& container, const std::string& cgroup) {
    return {{"cmd", "register"},     {"container_id", container}, {"pod_uid", "uid-1"},
            {"pod_name", "trainer"}, {"pod_namespace", "team"},   {"cgroup_path", cgroup}};
  }

  BuiltNode node_;
  Observer observer_;
  RecordingControl control_;
  AdminService service_;
};

TEST_F(AdminServiceTest, ASetForAPodWithAProcessAsksTheCoreToApplyIt) {
  node_.admit("team/trainer", {}, 0, 0);
  json answer = ask({{"cmd", "set"}, {"pod", "trainer"}, {"values", {{"weight", "4"}}}});
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  EXPECT_FALSE(answer.contains("note"));
  EXPECT_EQ(control_.calls, std::vector<std::string>{"policy team/trainer"});
  EXPECT_EQ(node_.pods->resolve_policy("team/trainer").weight, 4u);
}

TEST_F(AdminServiceTest, ASetForAPodWithNoProcessIsKeptForItsStartAndTheCoreIsNotAsked) {
  json answer = ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"weight", "4"}}}});
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  EXPECT_NE(answer.value("note", "").find("the values apply when it starts"), std::string::npos);
  EXPECT_TRUE(control_.calls.empty());
  EXPECT_EQ(node_.pods->resolve_policy("team/trainer").weight, 4u);
}

TEST_F(AdminServiceTest, ARefusedRequestChangesNothingAndReachesNoCore) {
  node_.admit("team/trainer", {}, 0, 0);
  EXPECT_FALSE(ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"weight", "lots"}}}})
                   .value("ok", true));
  EXPECT_FALSE(ask({{"cmd", "unset"}, {"pod", "team/trainer"}, {"keys", {"weight"}}})
                   .value("ok", true));
  EXPECT_FALSE(ask({{"cmd", "unregister"}, {"container_id", "c0ffee"}}).value("ok", true));
  EXPECT_FALSE(ask({{"cmd", "drain"}, {"gpu", "7"}}).value("ok", true));
  EXPECT_FALSE(ask({{"cmd", "launch"}}).value("ok", true));
  EXPECT_TRUE(control_.calls.empty());
  EXPECT_EQ(node_.pods->resolve_policy("team/trainer").weight, 2u);
  EXPECT_TRUE(node_.pods->overrides().empty());
}

TEST_F(AdminServiceTest, UnsetAndUnregisterAskTheCoreToReapplyWhatIsLeft) {
  node_.admit("team/trainer", {}, 0, 0);
  ASSERT_TRUE(ask(registration("c0ffee", "/kubepods/poduid-1/c0ffee")).value("ok", false));
  ASSERT_TRUE(ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"weight", "6"}}}})
                  .value("ok", false));
  ASSERT_TRUE(ask({{"cmd", "unset"}, {"pod", "team/trainer"}}).value("ok", false));
  ASSERT_TRUE(ask({{"cmd", "unregister"}, {"container_id", "c0ffee"}}).value("ok", false));
  EXPECT_EQ(control_.calls, (std::vector<std::string>{"policy team/trainer", "policy team/trainer",
                                                      "policy team/trainer",
                                                      "policy team/trainer"}));
  EXPECT_EQ(node_.pods->resolve_policy("team/trainer").weight, 2u);
}

TEST_F(AdminServiceTest, ADrainIsAskedOfTheCoreAndKeptInTheDrainFile) {
  json drained = ask({{"cmd", "drain"}, {"gpu", gpu_uuid(1)}});
  ASSERT_TRUE(drained.value("ok", false)) << drained.dump();
  EXPECT_EQ(drained.value("gpu", 9), 1);
  EXPECT_TRUE(drained.value("draining", false));
  EXPECT_TRUE(drained.value("idle", false));
  EXPECT_EQ(load_drained(node_.config), std::set<std::string>{gpu_uuid(1)});
  // Asked again, it is already drained: the core is not asked twice.
  ASSERT_TRUE(ask({{"cmd", "drain"}, {"gpu", "1"}}).value("ok", false));
  ASSERT_TRUE(ask({{"cmd", "undrain"}, {"gpu", "1"}}).value("ok", false));
  EXPECT_EQ(control_.calls, (std::vector<std::string>{"drain 1", "undrain 1"}));
  EXPECT_TRUE(load_drained(node_.config).empty());

  json wrong = ask({{"cmd", "drain"}, {"gpu", "GPU-nowhere"}});
  EXPECT_NE(wrong.value("error", "").find("managed: 0 " + gpu_uuid(0) + ", 1 " + gpu_uuid(1)),
            std::string::npos)
      << wrong.dump();
}

TEST_F(AdminServiceTest, DevicesListsEveryGpuOfTheNodeByNameUuidAndMinor) {
  json answer = ask({{"cmd", "devices"}});
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  ASSERT_EQ(answer.at("devices").size(), 2u);
  EXPECT_EQ(answer["devices"][1], json({{"name", "1"}, {"uuid", gpu_uuid(1)}, {"minor", 1},
                                        {"mig", false}}));
}

TEST_F(AdminServiceTest, StatusTopAndExplainAreTheObserversAnswers) {
  node_.admit("team/trainer", {}, 4, 0);
  json status = ask({{"cmd", "status"}});
  ASSERT_TRUE(status.value("ok", false)) << status.dump();
  EXPECT_EQ(status.value("scope", ""), node_.scope);
  EXPECT_EQ(status.at("gpus").at(0).at("tenants").size(), 1u) << status.dump();
  json top = ask({{"cmd", "top"}});
  EXPECT_TRUE(top.value("ok", false)) << top.dump();
  json explain = ask({{"cmd", "explain"}, {"pod", "team/trainer"}});
  EXPECT_TRUE(explain.value("ok", false)) << explain.dump();
  EXPECT_TRUE(control_.calls.empty());
}

}  // namespace
}  // namespace quanta::arbiter
