// A test's side of an HTTP endpoint (the arbiter's /metrics and /healthz): a TCP connection
// with a receive deadline, and one HTTP/1.0 GET read to the end.
#pragma once

#include <string>

namespace quanta::test_support {

// A connection to "HOST:PORT" (IPv4) whose reads give up after `timeout_s`; -1 on failure.
int connect_tcp(const std::string& address, int timeout_s = 10);

struct HttpAnswer {
  int status = 0;  // 0: no HTTP answer (no connection, or not HTTP)
  std::string body;
};

// GET `path` from "HOST:PORT" as HTTP/1.0: the status and the body after the headers.
HttpAnswer http_get(const std::string& address, const std::string& path, int timeout_s = 10);

}  // namespace quanta::test_support
