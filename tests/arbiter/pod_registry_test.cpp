// The pod registry's state file (each save replaces the file whole, the replaced file's last
// descriptor goes where the arbiter says, so freeing its blocks never waits on the event
// loop; only root reads it) and the binding of a pod's name to its uid.
#include "arbiter/pod_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace quanta::arbiter {
namespace {

// A registry saving into a folder of its own.
class PodRegistryState : public ::testing::Test {
 protected:
  PodRegistryState() {
    char pattern[] = "/tmp/quanta-pod-registry-XXXXXX";
    config_.scope = "registry-test";
    config_.state_dir = mkdtemp(pattern);
    file_ = config_.state_dir + "/registry-test.state.json";
  }
  ~PodRegistryState() override {
    std::error_code ignored;
    std::filesystem::remove_all(config_.state_dir, ignored);
  }
  NodeConfig config_;
  std::string file_;
  PodRegistry pods_{config_};
};

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = pread(fd, buffer, sizeof buffer, static_cast<off_t>(text.size()))) > 0)
    text.append(buffer, static_cast<size_t>(n));
  return text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t open_descriptors() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

TEST_F(PodRegistryState, ASaveHandsTheReplacedFileToTheCloserUnlinkedWithItsOldContent) {
  std::vector<int> handed;
  pods_.close_replaced_with([&](int fd) { handed.push_back(fd); });

  pods_.set_node_record(1, {});
  pods_.save_state();
  EXPECT_TRUE(handed.empty()) << "nothing was replaced by the first save";
  const std::string first = read_file(file_);
  ASSERT_NE(first.find("\"generation\": 1"), std::string::npos) << first;

  pods_.set_node_record(2, {});
  pods_.save_state();
  ASSERT_EQ(handed.size(), 1u);
  struct stat replaced {};
  struct stat current {};
  ASSERT_EQ(fstat(handed[0], &replaced), 0);
  ASSERT_EQ(stat(file_.c_str(), &current), 0);
  // The closer holds the last reference to the old file: unlinked by the rename, its
  // blocks are freed when the closer closes it.
  EXPECT_EQ(replaced.st_nlink, 0u);
  EXPECT_NE(replaced.st_ino, current.st_ino);
  EXPECT_EQ(read_all(handed[0]), first);
  EXPECT_NE(read_file(file_).find("\"generation\": 2"), std::string::npos);
  EXPECT_FALSE(pods_.state_file_changed());
  for (int fd : handed) close(fd);
}

TEST_F(PodRegistryState, WithoutACloserTheSaveClosesTheReplacedFileItself) {
  pods_.save_state();
  const size_t before = open_descriptors();
  for (int i = 0; i < 5; ++i) pods_.save_state();
  EXPECT_EQ(open_descriptors(), before);
  EXPECT_FALSE(pods_.state_file_changed());
}

TEST_F(PodRegistryState, TheStateFileIsReadableByRootOnly) {
  Registration r{"c1", "uid-1", "web", "prod", "server", "/kubepods/pod1/c1", {}, {}};
  ASSERT_EQ(pods_.register_container(r), "");
  pods_.save_state();
  struct stat st {};
  ASSERT_EQ(stat(file_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "it names every pod, its cgroup and its policy";
}

TEST_F(PodRegistryState, ALivePodsNameCannotBeClaimedWithAnotherUid) {
  pods_.probe_cgroups_with([](const std::string&) { return true; });
  ASSERT_EQ(pods_.register_container({"victim-c", "uid-victim", "web", "prod", "server", "/kubepods/pod-v/c", {}, {}}), "");
  const std::string err =
      pods_.register_container({"attacker-c", "uid-attacker", "web", "prod", "x", "/kubepods/pod-a/c", {}, {{"weight", "1000"}}});
  EXPECT_NE(err.find("a pod's name belongs to one live pod"), std::string::npos) << err;
  EXPECT_EQ(err.find("uid-victim"), std::string::npos) << "the refusal does not tell the other pod's uid";
  EXPECT_EQ(pods_.registrations().count("attacker-c"), 0u);
  EXPECT_EQ(pods_.registrations().count("victim-c"), 1u);
  // A second container of the same pod (same uid) still joins it.
  EXPECT_EQ(pods_.register_container({"victim-c2", "uid-victim", "web", "prod", "sidecar", "/kubepods/pod-v/c2", {}, {}}), "");
}

TEST_F(PodRegistryState, ARegistrationWhoseCgroupIsGoneYieldsToTheRecreatedPod) {
  std::string gone = "/kubepods/pod-old/c";
  pods_.probe_cgroups_with([&gone](const std::string& cgroup) { return cgroup != gone; });
  ASSERT_EQ(pods_.register_container({"old-c", "uid-old", "db-0", "prod", "pg", gone, {}, {}}), "");
  EXPECT_EQ(pods_.register_container({"new-c", "uid-new", "db-0", "prod", "pg", "/kubepods/pod-new/c", {}, {}}), "");
  EXPECT_EQ(pods_.registrations().count("old-c"), 0u) << "the ended pod's registration is dropped";
  EXPECT_EQ(pods_.registrations().count("new-c"), 1u);
}

TEST(CgroupExists, OnlyAVisibleHierarchyWithoutTheCgroupMeansGone) {
  EXPECT_TRUE(cgroup_exists("/")) << "the root always exists";
  EXPECT_TRUE(cgroup_exists("/no-such-hierarchy-quanta/pod/c")) << "a hierarchy not visible here cannot be judged";
  EXPECT_TRUE(cgroup_exists("/../etc")) << "a path with .. is not judged";
  std::error_code ec;
  const bool v2 = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers", ec);
  if (v2) {
    // A top-level folder that exists here, and a child of it that does not.
    for (const auto& entry : std::filesystem::directory_iterator("/sys/fs/cgroup", ec)) {
      if (!entry.is_directory()) continue;
      const std::string top = "/" + entry.path().filename().string();
      EXPECT_TRUE(cgroup_exists(top));
      EXPECT_FALSE(cgroup_exists(top + "/quanta-no-such-cgroup-" + std::to_string(getpid())));
      break;
    }
  }
}

}  // namespace
}  // namespace quanta::arbiter
