// quanta-bench's quanta configurations measure gated tenants: every pod of a run is admitted
// in its own pod with its policy, however many pods the run has (more than one cgroup may
// claim unregistered), and memcap samples the pod ledger the arbiter keeps in a sealed memfd.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/bench/run_command.h"

namespace {

using Json = nlohmann::json;

Json run_bench(const std::string& args, int& status) {
  const std::string command = std::string(QUANTA_BENCH_BINARY) + " " + args + " --json --gpu sim";
  return Json::parse(quanta::bench_tests::run_command(command, status), nullptr, false);
}

void expect_all_admitted(const Json& doc, const char* pointer, int tenants) {
  Json::json_pointer at(pointer);
  ASSERT_TRUE(doc.contains(at)) << pointer << " missing in " << doc.dump(2);
  const Json& admission = doc[at];
  EXPECT_EQ(admission.value("tenants", -1), tenants) << pointer << ": " << admission.dump();
  EXPECT_EQ(admission.value("admitted", -1), tenants) << pointer << ": " << admission.dump();
  EXPECT_FALSE(admission.contains("problems")) << pointer << ": " << admission.dump();
}

// 16 pods on 8 GPUs, twice the pods one cgroup may claim unregistered: each is registered
// with a cgroup of its own, so the arbiter lists all 16 in their pods with their weights
// (the bench checks the weights against the status and fails on any difference).
TEST(BenchAdmission, SixteenPodsAreAllAdmittedInTheirOwnPodsWithTheirWeights) {
  int status = -1;
  Json doc = run_bench("scale --quick --seconds 0.5", status);
  ASSERT_TRUE(doc.is_object()) << "quanta-bench scale printed no JSON";
  EXPECT_FALSE(doc.contains("not_admitted")) << doc["not_admitted"].dump(2);
  ASSERT_EQ(status, 0) << doc.dump(2);
  expect_all_admitted(doc, "/quanta/one_gpu/admission", 8);
  expect_all_admitted(doc, "/quanta/eight_gpus/admission", 16);
}

// The ledger is no file under /dev/shm: the bench maps the arbiter's memfd read-only and
// sees the eight processes' context charges (300Mi each) at least, never past the cap.
TEST(BenchAdmission, MemcapSamplesThePodLedgerFromTheArbitersMemfd) {
  int status = -1;
  Json doc = run_bench("memcap --quick", status);
  ASSERT_TRUE(doc.is_object()) << "quanta-bench memcap printed no JSON";
  ASSERT_EQ(status, 0) << doc.dump(2);
  const Json& quanta = doc["quanta"];
  EXPECT_GT(quanta.value("ledger_samples", 0), 0) << quanta.dump(2);
  ASSERT_TRUE(quanta.contains("ledger_max") && quanta["ledger_max"].is_number()) << quanta.dump(2);
  const uint64_t ledger_max = quanta["ledger_max"].get<uint64_t>();
  EXPECT_GE(ledger_max, 8ull * (300ull << 20)) << quanta.dump(2);
  EXPECT_LE(ledger_max, quanta.value("cap", 0ull)) << quanta.dump(2);
  expect_all_admitted(doc, "/quanta/admission", 16);
}

}  // namespace
