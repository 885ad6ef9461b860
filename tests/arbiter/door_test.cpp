// Unit tests of what stands at the arbiter's doors, without a daemon: names and escaping,
// the tenant and admin message parsers, the state file entry by entry, device grants,
// the recovery scan's maps parser, the log limiter and the sealed regions themselves.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "arbiter/loop/log_limit.h"
#include "arbiter/serving/admin_protocol.h"
#include "arbiter/serving/tenant_protocol.h"
#include "arbiter/state/device_access.h"
#include "arbiter/state/region_recovery.h"
#include "arbiter/state/regions.h"
#include "arbiter/state/state_file.h"
#include "common/version.h"
#include "common/wire.h"
#include "hosted/names.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

TEST(Names, PodKeysAreCheckedAtTheDoor) {
  EXPECT_EQ(hosted::check_pod_key("prod/web", "pod"), "");
  EXPECT_EQ(hosted::check_pod_key("uid:1234-abcd", "pod"), "");
  EXPECT_EQ(hosted::check_pod_key("demo-heavy_2.x", "pod"), "");
  EXPECT_NE(hosted::check_pod_key("", "pod"), "");
  EXPECT_NE(hosted::check_pod_key("a b", "pod"), "");
  EXPECT_NE(hosted::check_pod_key("bad\xff", "pod"), "");
  EXPECT_NE(hosted::check_pod_key("evil\x1b[2J", "pod"), "");
  EXPECT_NE(hosted::check_pod_key(std::string(300, 'a'), "pod"), "");
  const std::string err = hosted::check_pod_key("a\"b", "QUANTA_POD");
  EXPECT_NE(err.find("QUANTA_POD"), std::string::npos) << err;
  EXPECT_NE(err.find("letters, digits"), std::string::npos) << err;
}

TEST(Names, TextMustBePrintableUtf8) {
  EXPECT_EQ(hosted::check_text("/kubepods/burstable/pod-é", "cgroup_path", 100), "");
  EXPECT_NE(hosted::check_text("a\nb", "x", 100), "");
  EXPECT_NE(hosted::check_text("\xc0\xaf", "x", 100), "") << "an overlong form";
  EXPECT_NE(hosted::check_text("\xed\xa0\x80", "x", 100), "") << "a surrogate";
  EXPECT_NE(hosted::check_text("\xf4\x90\x80\x80", "x", 100), "") << "past U+10FFFF";
  EXPECT_NE(hosted::check_text("abc", "x", 2), "");
}

TEST(Names, PrintableEscapesWhatMovesATerminal) {
  EXPECT_EQ(hosted::printable("plain/name"), "plain/name");
  EXPECT_EQ(hosted::printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(hosted::printable("back\\slash"), "back\\\\slash");
  EXPECT_EQ(hosted::printable("\xff"), "\\xff");
  EXPECT_EQ(hosted::printable("caf\xc3\xa9"), "caf\xc3\xa9") << "ordinary UTF-8 stays readable";
  EXPECT_EQ(hosted::printable("\xc2\x9b"), "\\xc2\\x9b") << "a C1 control (CSI)";
  EXPECT_EQ(hosted::printable("\xe2\x80\xae"), "\\xe2\\x80\\xae") << "a right-to-left override";
  EXPECT_EQ(hosted::printable("line\nnext"), "line\\x0anext");
}

template <typename T>
std::string parse_bytes_of(const T& m, TenantMessage* out, size_t size = sizeof(T)) {
  return parse_tenant_message(&m, size, false, out);
}

TEST(TenantProtocol, AcceptsExactlyWellFormedMessages) {
  common::HelloMessage h{};
  h.header = common::make_header<common::HelloMessage>(common::MessageType::kHello);
  std::strcpy(h.claimed_pod, "pod-a");
  TenantMessage m;
  EXPECT_EQ(parse_bytes_of(h, &m), "");
  EXPECT_EQ(m.kind, TenantMessage::Kind::kHello);
  EXPECT_EQ(m.claimed_pod, "pod-a");
  common::AttachMessage a{};
  a.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  std::strcpy(a.uuid, "GPU-1");
  EXPECT_EQ(parse_bytes_of(a, &m), "");
  EXPECT_EQ(m.kind, TenantMessage::Kind::kAttach);
  EXPECT_EQ(m.uuid, "GPU-1");

  EXPECT_NE(parse_tenant_message(&h, sizeof(h), /*truncated=*/true, &m), "");
  EXPECT_NE(parse_bytes_of(h, &m, 3), "");
  common::HelloMessage bad = h;
  bad.header.magic = 1;
  EXPECT_NE(parse_bytes_of(bad, &m), "");
  bad = h;
  bad.header.version = common::kWireVersion + 1;
  EXPECT_NE(parse_bytes_of(bad, &m), "");
  bad = h;
  bad.header.size = 12;
  EXPECT_NE(parse_bytes_of(bad, &m), "");
  bad = h;
  std::memset(bad.claimed_pod, 'x', sizeof(bad.claimed_pod));
  EXPECT_NE(parse_bytes_of(bad, &m), "") << "a name without its NUL";
  bad = h;
  bad.header.type = common::MessageType::kWelcome;  // a reply, never a request
  bad.header.size = sizeof(bad);
  EXPECT_NE(parse_bytes_of(bad, &m), "");
}

TEST(TenantProtocol, AnotherProtocolVersionIsRefusedNamingBothAndWhatToDo) {
  common::HelloMessage h{};
  h.header = common::make_header<common::HelloMessage>(common::MessageType::kHello);
  TenantMessage m;
  EXPECT_EQ(parse_bytes_of(h, &m), "");
  EXPECT_EQ(m.other_version, 0u);
  const std::string speaks = " speaks " + std::to_string(common::kTenantProtocol.speaks) +
                             " and accepts " + common::accepted_range(common::kTenantProtocol);
  // An older shim (a pod started under the release before), then a newer one (a rollback).
  h.header.version = common::kTenantProtocol.oldest - 1;
  h.header.size = 40;  // whatever that release's Hello measured
  std::string err = parse_tenant_message(&h, 40, false, &m);
  EXPECT_EQ(m.other_version, common::kTenantProtocol.oldest - 1);
  EXPECT_NE(err.find("its libquanta.so speaks tenant protocol " +
                     std::to_string(common::kTenantProtocol.oldest - 1)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(speaks), std::string::npos) << err;
  EXPECT_NE(err.find("restart the pod"), std::string::npos) << err;
  TenantMessage newer;
  h.header.version = common::kTenantProtocol.newest + 1;
  err = parse_tenant_message(&h, sizeof h, false, &newer);
  EXPECT_EQ(newer.other_version, common::kTenantProtocol.newest + 1);
  EXPECT_NE(err.find(speaks), std::string::npos) << err;
  EXPECT_NE(err.find("older than the pod's libquanta.so"), std::string::npos) << err;
  // Garbage is not a version: no magic, no version read.
  TenantMessage junk;
  h.header.magic = 1;
  EXPECT_NE(parse_bytes_of(h, &junk), "");
  EXPECT_EQ(junk.other_version, 0u);
}

TEST(AdminProtocol, ParsesRequestsAndRefusesWhatIsNotOne) {
  AdminRequest r;
  EXPECT_EQ(parse_admin_request(R"({"cmd":"status"})", &r), "");
  EXPECT_EQ(r.command, AdminRequest::Command::kStatus);
  EXPECT_EQ(
      parse_admin_request(R"({"cmd":"set","pod":"p","values":{"weight":4,"max-share":0.5}})", &r),
      "");
  EXPECT_EQ(r.values.at("weight"), "4");
  EXPECT_EQ(r.values.at("max-share"), "0.5");
  AdminRequest reg;
  EXPECT_EQ(parse_admin_request(
                R"({"cmd":"register","container_id":"c","pod_name":"n","cgroup_path":"/x",)"
                R"("devices":["GPU-1"],"policy":{"weight":"2"}})",
                &reg),
            "");
  EXPECT_EQ(reg.registration.devices, std::vector<std::string>{"GPU-1"});
  EXPECT_EQ(parse_admin_request(R"({"cmd":"devices"})", &r), "");
  EXPECT_EQ(r.command, AdminRequest::Command::kDevices) << "quanta-hook's device table";
  EXPECT_NE(parse_admin_request("not json", &r), "");
  EXPECT_NE(parse_admin_request(R"([1,2])", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":5})", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":"frob"})", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":"set","pod":7})", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":"set","pod":"p","values":[1]})", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":"register","container_id":"a\u001bb"})", &r), "");
  EXPECT_NE(parse_admin_request(R"({"cmd":"register","devices":"GPU-1"})", &r), "");
}

TEST(StateFile, OneBadEntryIsDroppedAndEveryOtherKept) {
  SavedState s;
  s.generation = 7;
  Registration reg;
  reg.container_id = "c1";
  reg.pod_name = "web";
  reg.pod_namespace = "prod";
  reg.cgroup_path = "/kubepods/c1";
  reg.devices = {"GPU-1"};
  reg.policy = {{"weight", "3"}};
  s.registrations.push_back(reg);
  s.overrides["prod/web"] = {{"weight", "5"}};
  s.pods[0] = SavedPod{"prod/web", 1234, 0xfeedfacecafebeefull, {10, 11}, ""};
  s.pods[3] = SavedPod{"dev", 99, 1, {}, "/user.slice/session-4.scope"};
  s.gpus[0] = SavedGpu{"GPU-1", {555}};
  s.gpus[2] = SavedGpu{"GPU-3", {556, 557}};
  std::vector<std::string> warnings;
  EXPECT_EQ(parse_state(render_state(s), &warnings), s);
  EXPECT_TRUE(warnings.empty());

  json j = json::parse(render_state(s));
  j["registrations"].push_back({{"container_id", 5}});
  j["registrations"].push_back("nonsense");
  j["pods"]["x"] = {{"key", "p"}};
  j["pods"]["4"] = {{"key", "q"}, {"pids", {-3}}};
  j["pods"]["5"] = {{"key", "r"}, {"tag", "not-hex"}};
  j["pods"]["6"] = {{"key", "s"}, {"claimed_from", 12}};
  j["overrides"]["bad"] = 5;
  j["gpus"]["1"] = "GPU-2";
  SavedState parsed = parse_state(j.dump(), &warnings);
  EXPECT_EQ(parsed, s) << "good entries were lost beside bad ones";
  EXPECT_EQ(warnings.size(), 8u);
  for (const std::string& w : warnings) EXPECT_FALSE(w.empty());
  warnings.clear();
  EXPECT_EQ(parse_state("{not json", &warnings), SavedState());
  EXPECT_EQ(warnings.size(), 1u);
}

TEST(StateFile, NamesThatAreNotUtf8NeverStopASave) {
  SavedState s;
  s.pods[0] = SavedPod{"bad\xff\xfe", 1, 1, {}, ""};
  std::string text;
  EXPECT_NO_THROW(text = render_state(s));
  std::vector<std::string> warnings;
  SavedState back = parse_state(text, &warnings);
  EXPECT_EQ(back.pods.size(), 1u);
}

std::vector<GpuInfo> two_gpus_with_a_mig() {
  return {GpuInfo{"GPU-a", "", 0, "0", ""}, GpuInfo{"MIG-a1", "GPU-a", 0, "0:0", ""}, GpuInfo{"GPU-b", "", 1, "1", ""}};
}

TEST(DeviceAccess, ARegistrationsListGrantsGpusAndTheirMigInstances) {
  DeviceGrant g = devices_listed({"GPU-a"}, two_gpus_with_a_mig());
  EXPECT_FALSE(g.all);
  EXPECT_EQ(g.uuids, (std::set<std::string>{"GPU-a", "MIG-a1"}));
  g = devices_listed({"MIG-a1", "GPU-unknown"}, two_gpus_with_a_mig());
  EXPECT_EQ(g.uuids, (std::set<std::string>{"MIG-a1"}));
}

TEST(DeviceAccess, ACgroupDeviceListGrantsTheGpusOfItsMinors) {
  EXPECT_TRUE(devices_in_cgroup_list("a *:* rwm\n", two_gpus_with_a_mig()).all);
  DeviceGrant g = devices_in_cgroup_list("c 1:3 rwm\nc 195:1 rw\nc 195:255 rw\nc 195:0 m\n",
                                         two_gpus_with_a_mig());
  EXPECT_FALSE(g.all);
  EXPECT_EQ(g.uuids, (std::set<std::string>{"GPU-b"})) << "mknod-only access grants nothing";
  g = devices_in_cgroup_list("c 195:* rw\n", two_gpus_with_a_mig());
  EXPECT_EQ(g.uuids.size(), 3u);
  EXPECT_TRUE(devices_in_cgroup_list("garbage\nc x:y rw\n", two_gpus_with_a_mig()).uuids.empty());
}

TEST(DeviceAccess, UnregisteredProcessesKeepEveryGpu) {
  EXPECT_TRUE(devices_granted(nullptr, getpid(), two_gpus_with_a_mig()).all);
}

TEST(RegionRecovery, FindsOnlyThisScopesMemfdsInAProcessMaps) {
  const std::string maps =
      "7f0000000000-7f0000041000 rw-s 00000000 00:01 1192                       /memfd:q1.pod.0 "
      "(deleted)\n"
      "7f0000041000-7f0000052000 r--s 00000000 00:01 1193                       /memfd:q1.gpu.1 "
      "(deleted)\n"
      "7f0000052000-7f0000053000 r--s 00000000 00:01 1194                       /memfd:q10.pod.0 "
      "(deleted)\n"
      "7f0000053000-7f0000054000 r--s 00000000 00:01 1195                       /memfd:q1.pod.2\n"
      "7f0000054000-7f0000055000 r--p 00000000 fe:00 2222                       "
      "/usr/lib/libc.so.6\n"
      "garbage line\n";
  auto found = memfd_mappings(maps, "q1");
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "q1.pod.0");
  EXPECT_EQ(found[0].inode, 1192u);
  EXPECT_EQ(found[0].range, "7f0000000000-7f0000041000");
  EXPECT_EQ(found[1].name, "q1.gpu.1");
}

TEST(LogLimiter, ABurstPerIntervalThenOneLineSayingHowManyWereLeftOut) {
  LogLimiter limit(3, 1000);
  uint64_t suppressed = 0;
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += limit.allow("drop", 100, &suppressed) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  EXPECT_TRUE(limit.allow("other", 100, &suppressed)) << "kinds are limited apart";
  EXPECT_TRUE(limit.allow("drop", 1200, &suppressed));
  EXPECT_EQ(suppressed, 7u);
}

TEST(StateFile, AGpuOfThePreviousReleaseNamesOneControlRegionAndThisOneEachLayoutsFirstOldest) {
  std::vector<std::string> warnings;
  SavedState old = parse_state(R"({"version": 2, "gpus": {"0": {"uuid": "GPU-1", "inode": 77}}})",
                               &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(old.gpus.at(0).inodes, std::vector<uint64_t>{77});
  SavedState s;
  s.gpus[0] = SavedGpu{"GPU-1", {12, 34}};
  const json j = json::parse(render_state(s));
  EXPECT_EQ(j["gpus"]["0"]["inode"], 12) << "a release that reads one region reads the oldest layout's";
  EXPECT_EQ(j["gpus"]["0"]["inodes"], json::array({12, 34}));
  json bad = j;
  bad["gpus"]["0"]["inodes"] = json::array({1, 2, 3});
  bad["gpus"]["1"] = {{"uuid", "GPU-2"}, {"inodes", {"x"}}};
  SavedState dropped = parse_state(bad.dump(), &warnings);
  EXPECT_TRUE(dropped.gpus.empty());
  EXPECT_EQ(warnings.size(), 2u);
}

TEST(Regions, AControlRegionCannotBeWrittenOrResizedThroughAnyDescriptor) {
  ControlRegionMap r = ControlRegionMap::create("door-test.gpu.0");
  ASSERT_TRUE(r);
  r->header.holder.store(5);  // the creator's own mapping stays writable
  EXPECT_EQ(fcntl(r.tenant_fd(), F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(seals_of(r.tenant_fd()), kControlSeals);
  const std::string self = "/proc/self/fd/" + std::to_string(r.tenant_fd());
  UniqueFd rw(::open(self.c_str(), O_RDWR));
  ASSERT_TRUE(rw);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0), MAP_FAILED);
  EXPECT_NE(ftruncate(rw.get(), 0), 0);
  EXPECT_NE(fcntl(rw.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_EQ(check_control_header(r.get(), sizeof(common::ControlRegion)), "");
}

TEST(Regions, APodRegionIsWritableButNeverResizedAndIsReadoptedOnlyWithItsTag) {
  PodRegionMap r = PodRegionMap::create("door-test.pod.0", common::kLayoutVersion);
  r.header().recovery_tag = 42;
  EXPECT_EQ(seals_of(r.tenant_fd()), kRegionSeals);
  EXPECT_NE(ftruncate(r.tenant_fd(), 0), 0);
  void* p = mmap(nullptr, sizeof(common::PodRegion), PROT_READ | PROT_WRITE, MAP_SHARED,
                 r.tenant_fd(), 0);
  ASSERT_NE(p, MAP_FAILED) << "tenants must be able to map their pod region writable";
  munmap(p, sizeof(common::PodRegion));
  const std::string self = "/proc/self/fd/" + std::to_string(r.tenant_fd());
  EXPECT_THROW(PodRegionMap::adopt(UniqueFd(::open(self.c_str(), O_RDWR)), "x", 41), RegionError);
  PodRegionMap again = PodRegionMap::adopt(UniqueFd(::open(self.c_str(), O_RDWR)), "x", 42);
  EXPECT_EQ(again.inode(), r.inode());
  // A look-alike: an unsealed memfd with the right contents is refused.
  UniqueFd fake(memfd_create("door-test.pod.0", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(fake.get(), sizeof(common::PodRegion)), 0);
  ASSERT_EQ(pwrite(fake.get(), &r.header(), sizeof(common::PodHeader), 0),
            static_cast<ssize_t>(sizeof(common::PodHeader)));
  EXPECT_THROW(PodRegionMap::adopt(std::move(fake), "x", 42), RegionError);
}

TEST(Regions, APodRegionOfThePreviousLayoutIsMadeAndReadoptedInItsOwnLayout) {
  PodRegionMap r = PodRegionMap::create("door-test.pod.1", common::layout2::kVersion);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.layout(), 2u);
  EXPECT_EQ(r.header().version, 2u);
  EXPECT_EQ(r.header().size, sizeof(common::layout2::PodRegion));
  EXPECT_EQ(r.memory_cap(0), nullptr) << "layout 2 keeps caps in the control slots";
  EXPECT_EQ(r.limits(0, 0), nullptr);
  // The words a layout-2 shim reads sit where that layout put them.
  const auto* base = reinterpret_cast<const unsigned char*>(&r.header());
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(&r.memory_used(1)) - base, 320 + 8);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(&r.pid(1)) - base,
            static_cast<long>(1344 + sizeof(common::layout2::ProcEntry)));
  r.header().recovery_tag = 7;
  r.memory_used(3).store(99);
  const std::string self = "/proc/self/fd/" + std::to_string(r.tenant_fd());
  PodRegionMap again = PodRegionMap::adopt(UniqueFd(::open(self.c_str(), O_RDWR)), "y", 7);
  EXPECT_EQ(again.layout(), 2u);
  EXPECT_EQ(again.memory_used(3).load(), 99u);
  EXPECT_THROW(PodRegionMap::create("door-test.pod.2", 1), RegionError);
}

TEST(Regions, HeaderChecksNameTheLayoutsTheArbiterAccepts) {
  std::vector<unsigned char> bytes(sizeof(common::PodRegion), 0);
  const uint32_t layout1[3] = {common::kPodMagic, 1, sizeof(common::PodRegion)};
  std::memcpy(bytes.data(), layout1, sizeof(layout1));
  EXPECT_NE(check_pod_header(bytes.data(), bytes.size(), 0).find("shared-memory layout 1; this arbiter"),
            std::string::npos);
  EXPECT_NE(check_pod_header(bytes.data(), bytes.size(), 0).find("accepts 2 to 3"), std::string::npos);
  // A layout-2 header must come with layout 2's size, not layout 3's.
  const uint32_t layout2[3] = {common::kPodMagic, 2, sizeof(common::PodRegion)};
  std::memcpy(bytes.data(), layout2, sizeof(layout2));
  EXPECT_NE(check_pod_header(bytes.data(), bytes.size(), 0).find("layout 2 has"), std::string::npos);
  const uint32_t good2[3] = {common::kPodMagic, 2, sizeof(common::layout2::PodRegion)};
  std::memcpy(bytes.data(), good2, sizeof(good2));
  EXPECT_EQ(check_pod_header(bytes.data(), sizeof(common::layout2::PodRegion), 0), "");
  const uint32_t control2[3] = {common::kControlMagic, 2, sizeof(common::layout2::ControlRegion)};
  std::memcpy(bytes.data(), control2, sizeof(control2));
  EXPECT_EQ(check_control_header(bytes.data(), sizeof(common::layout2::ControlRegion)), "");
}

TEST(Regions, HeaderChecksRefuseForeignOrShortRegions) {
  std::vector<unsigned char> bytes(sizeof(common::PodRegion), 0);
  EXPECT_NE(check_pod_header(bytes.data(), bytes.size(), 0), "");
  EXPECT_NE(check_pod_header(bytes.data(), 10, 0), "");
  EXPECT_NE(check_control_header(nullptr, 0), "");
}

}  // namespace
}  // namespace quanta::arbiter
