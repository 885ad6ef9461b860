// The pod registry's state file: each save replaces the file whole, and the replaced file's
// last descriptor goes where the arbiter says, so freeing its blocks never waits on the
// event loop.
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

struct StateDir {
  std::string path;
  StateDir() {
    char pattern[] = "/tmp/quanta-pod-registry-XXXXXX";
    path = mkdtemp(pattern);
  }
  ~StateDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
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

TEST(PodRegistryState, ASaveHandsTheReplacedFileToTheCloserUnlinkedWithItsOldContent) {
  StateDir dir;
  NodeConfig config;
  config.scope = "registry-test";
  config.state_dir = dir.path;
  PodRegistry pods(config);
  std::vector<int> handed;
  pods.close_replaced_with([&](int fd) { handed.push_back(fd); });
  const std::string file = dir.path + "/registry-test.state.json";

  pods.set_node_record(1, {});
  pods.save_state();
  EXPECT_TRUE(handed.empty()) << "nothing was replaced by the first save";
  const std::string first = read_file(file);
  ASSERT_NE(first.find("\"generation\": 1"), std::string::npos) << first;

  pods.set_node_record(2, {});
  pods.save_state();
  ASSERT_EQ(handed.size(), 1u);
  struct stat replaced {};
  struct stat current {};
  ASSERT_EQ(fstat(handed[0], &replaced), 0);
  ASSERT_EQ(stat(file.c_str(), &current), 0);
  // The closer holds the last reference to the old file: unlinked by the rename, its
  // blocks are freed when the closer closes it.
  EXPECT_EQ(replaced.st_nlink, 0u);
  EXPECT_NE(replaced.st_ino, current.st_ino);
  EXPECT_EQ(read_all(handed[0]), first);
  EXPECT_NE(read_file(file).find("\"generation\": 2"), std::string::npos);
  EXPECT_FALSE(pods.state_file_changed());
  for (int fd : handed) close(fd);
}

TEST(PodRegistryState, WithoutACloserTheSaveClosesTheReplacedFileItself) {
  StateDir dir;
  NodeConfig config;
  config.scope = "registry-test";
  config.state_dir = dir.path;
  PodRegistry pods(config);
  pods.save_state();
  const size_t before = open_descriptors();
  for (int i = 0; i < 5; ++i) pods.save_state();
  EXPECT_EQ(open_descriptors(), before);
  EXPECT_FALSE(pods.state_file_changed());
}

}  // namespace
}  // namespace quanta::arbiter
