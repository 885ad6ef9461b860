// A folder of a test's own under /tmp, removed with everything in it when the test is done,
// and the reading back of the files a test's programs wrote there.
#pragma once

#include <string>

namespace quanta::test_support {

class TempDir {
 public:
  // /tmp/<prefix>-XXXXXX; throws std::runtime_error when it cannot be made.
  explicit TempDir(const std::string& prefix = "quanta-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole of a file, "" when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace quanta::test_support
