// `quantactl status`'s answer worked out from a node built by hand: every field the
// documented example shows (docs/quantactl-status.md) and no other, and the values derived
// from what was gathered (averages, nulls for what is not known, the over-cap action).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "arbiter/observing/admin_views.h"
#include "tests/support/temp_dir.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

// A node with one GPU held by one of its two tenants, an unmanaged process, a pod over its
// cap and an NVML error: every optional field present.
NodeStatus full_node() {
  NodeStatus node;
  node.scope = "quanta";
  node.generation = 3;
  node.started_ns = 1'000'000'000;
  node.taken_ns = 3'500'000'000;
  node.enforce.over_cap = config::OverCapAction::kReport;
  node.context_overhead = {
      {"bytes", 543162368}, {"source", "measured"}, {"measured", {{"NVIDIA H200", 543162368}}}};
  node.tenant_connections = 2;
  node.metrics_listen = "127.0.0.1:9400";
  GpuStatus gpu;
  gpu.index = 0;
  gpu.uuid = "GPU-0";
  gpu.holder = HolderStatus{2, 4242, "prod/web"};
  gpu.waiting = 1;
  gpu.grants = 10;
  gpu.switches = 9;
  gpu.last_granted = 2;
  TenantStatus web;
  web.report = {2, 0, TenantState::kHolding, 0.5, 0.25, 3'000'000, 20'000'000, 7, 1};
  web.pid = 4242;
  web.pod = "prod/web";
  web.policy.weight = 4;
  web.policy.min_share_ppm = 250'000;
  web.gate_waits = 4;
  web.gate_wait_ns = 10'000'000;
  web.gate_wait_max_ns = 5'000'000;
  web.memory_used = 1024;
  web.memory_cap = 4096;
  web.layout = 3;
  web.nvml_memory_used = 2048;
  web.connected = true;
  TenantStatus batch;
  batch.report = {5, 1, TenantState::kWaiting, 0.5, 0.75, 0, 20'000'000, 0, 0};
  batch.pid = 4250;
  batch.pod = "prod/batch";
  gpu.tenants = {web, batch};
  gpu.unmanaged = {{5120, 268435456, "", "python3"}};
  gpu.over_cap = {{"prod/web", 8192, 4096}};
  gpu.nvml_error = "NVML_ERROR_UNKNOWN";
  node.gpus = {gpu};
  return node;
}

// The documented example: JSON with `//` comments, its commented-out fields restored.
json documented_example() {
  const std::string doc = test_support::read_file(QUANTA_SOURCE_DIR "/docs/quantactl-status.md");
  const std::string heading = "## `status` response";
  const size_t section = doc.find(heading);
  EXPECT_NE(section, std::string::npos) << "docs/quantactl-status.md has no " << heading;
  const size_t begin = doc.find("```json\n", section) + 8;
  const size_t end = doc.find("\n```", begin);
  std::string text;
  bool in_string = false;
  for (size_t i = begin; i < end; ++i) {
    const char c = doc[i];
    if (in_string) {
      text += c;
      if (c == '\\')
        text += doc[++i];
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
      text += c;
    } else if (c == '/' && doc[i + 1] == '/') {
      // A comment that is a field left out of the example ("only when …") stays a comment.
      while (i < end && doc[i] != '\n') ++i;
      text += '\n';
    } else {
      text += c;
    }
  }
  json example = json::parse(text, nullptr, false);
  EXPECT_FALSE(example.is_discarded()) << text;
  if (!example.is_discarded()) example["gpus"][0]["nvml_error"] = "…";  // documented as optional
  return example;
}

// Every key path of `value` ("gpus[].tenants[].pid"); an array's paths are its first element's.
void key_paths(const json& value, const std::string& at, std::set<std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, member] : value.items()) {
      const std::string path = at.empty() ? key : at + "." + key;
      out.insert(path);
      key_paths(member, path, out);
    }
  } else if (value.is_array() && !value.empty()) {
    key_paths(value[0], at + "[]", out);
  }
}

TEST(StatusAnswer, CarriesEveryFieldTheDocumentedExampleShowsAndNoOther) {
  std::set<std::string> documented;
  std::set<std::string> answered;
  key_paths(documented_example(), "", documented);
  key_paths(status_answer(full_node()), "", answered);
  for (const std::string& path : documented)
    EXPECT_EQ(answered.count(path), 1u) << "missing: " << path;
  for (const std::string& path : answered)
    EXPECT_EQ(documented.count(path), 1u) << "undocumented: " << path;
}

TEST(StatusAnswer, DerivesAveragesAndSharesAndMarksWhatIsNotKnownNull) {
  const json status = status_answer(full_node());
  EXPECT_TRUE(status["ok"].get<bool>());
  EXPECT_DOUBLE_EQ(status["uptime_s"].get<double>(), 2.5);
  EXPECT_EQ(status["enforce"]["over_cap"], "report");
  const json& gpu = status["gpus"][0];
  EXPECT_EQ(gpu["holder"], (json{{"slot", 2}, {"pid", 4242}, {"pod", "prod/web"}}));
  EXPECT_EQ(gpu["last_granted"], 2);
  EXPECT_EQ(gpu["nvml_error"], "NVML_ERROR_UNKNOWN");
  const json& web = gpu["tenants"][0];
  EXPECT_DOUBLE_EQ(web["gate_wait_avg_ms"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(web["gate_wait_max_ms"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(web["wait_p99_ms"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(web["quantum_ms"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(web["min_share"].get<double>(), 0.25);
  EXPECT_EQ(web["state"], "holding");
  EXPECT_EQ(web["revoke_timeouts"], 1);
  EXPECT_EQ(web["nvml_memory_used"], 2048);
  const json& batch = gpu["tenants"][1];
  EXPECT_EQ(batch["gate_wait_avg_ms"], 0.0) << "no waits: no average, never a division by zero";
  EXPECT_TRUE(batch["nvml_memory_used"].is_null()) << "NVML does not list it";
  EXPECT_EQ(batch["connected"], false);
  EXPECT_TRUE(gpu["unmanaged"][0]["pod"].is_null()) << "in no pod's cgroup";
  EXPECT_EQ(gpu["over_cap"][0]["action"], "report") << "the node's [enforce] over_cap";

  NodeStatus quiet = full_node();
  quiet.gpus[0].holder.reset();
  quiet.gpus[0].last_granted.reset();
  quiet.gpus[0].nvml_error.clear();
  const json answer = status_answer(quiet);
  EXPECT_TRUE(answer["gpus"][0]["holder"].is_null());
  EXPECT_TRUE(answer["gpus"][0]["last_granted"].is_null());
  EXPECT_FALSE(answer["gpus"][0].contains("nvml_error")) << "only when NVML failed";
}

}  // namespace
}  // namespace quanta::arbiter
