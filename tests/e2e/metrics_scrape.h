// uopd's /metrics from a test: where it is served (from its log), a scrape over plain
// HTTP/1.0, and a value read from the text.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "client/embedded_server.h"
#include "tests/e2e/worker_proc.h"

namespace uop::testing {

// A gauge's value on /metrics ("name value"); -1 when it is not there.
inline double gauge(const std::string& metrics_body, const std::string& name) {
  for (size_t at = metrics_body.find(name + " "); at != std::string::npos; at = metrics_body.find(name + " ", at + 1))
    if (at == 0 || metrics_body[at - 1] == '\n') return std::stod(metrics_body.substr(at + name.size() + 1));
  return -1;
}

// host:port of uopd's /metrics, from its log line.
inline std::string metrics_address(const client::EmbeddedServer& p) {
  std::string address;
  wait_until([&] {
    std::string log = p.log_tail(1 << 16);
    auto at = log.find("metrics on http://");
    if (at == std::string::npos) return false;
    at += std::strlen("metrics on http://");
    address = log.substr(at, log.find('/', at) - at);
    return true;
  });
  return address;
}

// A TCP connection to host:port, with a receive timeout so that no read blocks the test.
inline int connect_to(const std::string& address) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  inet_pton(AF_INET, address.substr(0, address.rfind(':')).c_str(), &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics; the body, or "" when the server did not answer.
inline std::string scrape(const std::string& address) {
  int fd = connect_to(address);
  if (fd < 0) return "";
  std::string req = "GET /metrics HTTP/1.0\r\nHost: uopd\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out.rfind("HTTP/1.", 0) == 0 ? out : "";
}

// A value on the /metrics served at `address`, now (gauge's rules); -1 when it is not there.
inline double metric(const std::string& address, const std::string& name) { return gauge(scrape(address), name); }

}  // namespace uop::testing
