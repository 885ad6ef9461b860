// Every quanta-bench scenario, run in --quick mode on simgpu, prints one JSON object with
// the fields bench/METHODS.md names; a figure may be null only where a note says why. Keeps
// the benchmark from rotting as the parts it drives change.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tests/bench/run_command.h"

namespace {

using Json = nlohmann::json;

struct Expectation {
  const char* scenario;
  std::vector<const char*> figures;  // JSON pointers that must exist (number, or null with a note)
};

const Expectation kExpectations[] = {
    {"fairness",
     {"/native/tenants/0/weight", "/native/tenants/2/target_share", "/native/tenants/2/achieved_share",
      "/native/max_share_error_pp", "/native/utilization", "/quanta/tenants/2/achieved_share",
      "/quanta/max_share_error_pp", "/quanta/utilization"}},
    {"interactive",
     {"/solo/p50_ms", "/solo/p99_ms", "/native/p50_ms", "/native/p99_ms", "/native/batch_throughput", "/quanta/p50_ms",
      "/quanta/p99_ms", "/quanta/batch_throughput"}},
    {"interactive-8",
     {"/solo/p99_ms", "/native/p99_ms", "/native/batch_throughput", "/quanta/p99_ms", "/quanta/batch_throughput",
      "/p99_over_native"}},
    {"overhead", {"/native/useful_per_s", "/quanta/useful_per_s", "/ratio"}},
    {"handoff", {"/quanta/p50_us", "/quanta/p99_us", "/futex_p50_us"}},
    {"launch-cost",
     {"/direct/launch_ns", "/quanta/launch_ns", "/added_launch_ns", "/direct/alloc_free_ns", "/quanta/alloc_free_ns",
      "/quanta/launch_ns_8_threads", "/added_launch_ns_8_threads"}},
    {"memcap", {"/quanta/cap", "/quanta/max_committed", "/quanta/overshoot_bytes", "/quanta/denials", "/quanta/allocs_per_s"}},
    {"scale",
     {"/quanta/one_gpu/max_share_error_pp", "/quanta/one_gpu/handoff_p99_us", "/quanta/one_gpu/arbiter_cpu_s_per_s",
      "/quanta/eight_gpus/max_share_error_pp", "/quanta/eight_gpus/handoff_p99_us",
      "/quanta/eight_gpus/arbiter_cpu_s_per_s"}},
    {"churn", {"/native/max_wait_ms", "/native/max_share_error_pp", "/quanta/max_wait_ms", "/quanta/max_share_error_pp"}},
};

void PrintTo(const Expectation& expectation, std::ostream* out) { *out << expectation.scenario; }

using quanta::bench_tests::run_command;

// True when the object at `pointer` or any object above it carries a note.
bool explained(const Json& doc, Json::json_pointer pointer) {
  while (!pointer.empty()) {
    pointer = pointer.parent_pointer();
    if (doc.contains(pointer) && doc[pointer].is_object() && doc[pointer].contains("note")) return true;
  }
  return false;
}

bool any_note(const Json& value) {
  if (value.is_object()) {
    if (value.contains("note")) return true;
    for (const auto& item : value) {
      if (any_note(item)) return true;
    }
  } else if (value.is_array()) {
    for (const auto& item : value) {
      if (any_note(item)) return true;
    }
  }
  return false;
}

// Every "admission" object (one per quanta configuration): each tenant listed by the
// arbiter in its pod, none with a problem.
void expect_admitted(const Json& value, const std::string& where) {
  if (value.is_object()) {
    if (value.contains("admission")) {
      const Json& a = value["admission"];
      EXPECT_GT(a.value("tenants", 0), 0) << where << "/admission: " << a.dump();
      EXPECT_EQ(a.value("admitted", -1) + a.value("unverified", 0), a.value("tenants", -2))
          << where << "/admission: " << a.dump();
      EXPECT_FALSE(a.contains("problems")) << where << "/admission: " << a.dump();
    }
    for (const auto& [key, item] : value.items()) expect_admitted(item, where + "/" + key);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      expect_admitted(value[i], where + "/" + std::to_string(i));
  }
}

class BenchSmoke : public ::testing::TestWithParam<Expectation> {};

TEST_P(BenchSmoke, QuickRunPrintsTheDesignFieldsWithNullsExplained) {
  const Expectation& expect = GetParam();
  int status = -1;
  std::string out = run_command(std::string(QUANTA_BENCH_BINARY) + " " + expect.scenario + " --json --quick --gpu sim", status);
  ASSERT_EQ(status, 0) << "quanta-bench " << expect.scenario << " failed; stdout: " << out;
  Json doc;
  ASSERT_NO_THROW(doc = Json::parse(out)) << out;
  EXPECT_EQ(doc.value("scenario", ""), expect.scenario);
  EXPECT_FALSE(doc.contains("not_admitted")) << doc["not_admitted"].dump(2);
  expect_admitted(doc, "");
  for (const char* key : {"cpu", "cores", "kernel", "gpu"}) EXPECT_TRUE(doc["machine"].contains(key)) << key;
  EXPECT_EQ(doc["machine"]["gpu"], "simgpu");
  EXPECT_TRUE(doc.contains("date"));
  EXPECT_TRUE(doc.contains("command"));
  ASSERT_TRUE(doc.contains("targets") && doc["targets"].is_object() && !doc["targets"].empty());
  for (const auto& [name, target] : doc["targets"].items()) {
    EXPECT_TRUE(target.contains("met") && target.contains("limit") && target.contains("value")) << name;
    if (target["met"].is_null()) {
      EXPECT_TRUE(any_note(doc)) << "target " << name << " unmeasured without a note";
    }
  }
  for (const char* figure : expect.figures) {
    Json::json_pointer pointer(figure);
    ASSERT_TRUE(doc.contains(pointer)) << figure << " missing in " << doc.dump(2);
    const Json& value = doc[pointer];
    if (value.is_null()) {
      // A derived top-level figure is null when an input is; some configuration says why.
      bool top_level = std::string(figure).find('/', 1) == std::string::npos;
      EXPECT_TRUE(top_level ? any_note(doc) : explained(doc, pointer))
          << figure << " is null without a note in " << doc.dump(2);
    } else {
      EXPECT_TRUE(value.is_number()) << figure << " = " << value.dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, BenchSmoke, ::testing::ValuesIn(kExpectations),
                         [](const ::testing::TestParamInfo<Expectation>& info) {
                           std::string name = info.param.scenario;
                           for (auto& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
