#include "tests/daemons/metrics_probe.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/daemons/disagg_fixture.h"  // RunCapture

namespace kvstream::testing {

int ReadMetricsPort(const std::string& path, Deadline deadline) {
  while (Clock::now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string Scrape(int port, const std::string& user_password) {
  HttpReply r = HttpGet(port, "/metrics", user_password);
  return r.status == 200 ? r.body : "";
}

double SampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ')
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
  }
  return NAN;
}

std::set<std::string> MetricNames(const std::string& text) {
  std::set<std::string> names;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    names.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return names;
}

std::string PromtoolCheck(const std::string& text, const std::string& dir, int* rc) {
  int which_rc = 0;
  RunCapture("command -v promtool", &which_rc);
  if (which_rc != 0) {
    *rc = -2;
    return "promtool not installed";
  }
  const std::string path = dir + "/scrape.txt";
  std::ofstream(path) << text;
  return RunCapture("promtool check metrics < " + path, rc, /*with_stderr=*/true);
}

}  // namespace kvstream::testing
