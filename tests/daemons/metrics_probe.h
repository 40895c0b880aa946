// Reading the daemons' metrics in tests: the metrics port file, a scrape, one sample's value,
// the metric names of a scrape, promtool's verdict.
#pragma once

#include <set>
#include <string>

#include "common/time.h"
#include "tests/daemon/http_probe.h"

namespace kvstream::testing {

// The port a daemon wrote to `path` (its --metrics_port_file); -1 if none by the deadline.
int ReadMetricsPort(const std::string& path, Deadline deadline);
// GET /metrics (basic auth when `user_password` is given); the body, empty unless HTTP 200.
std::string Scrape(int port, const std::string& user_password = "");
// The value of the sample `series` (e.g. kvstream_pool_blocks{state="free"}); NAN if absent.
double SampleValue(const std::string& text, const std::string& series);
// Every family name a scrape declares (# TYPE lines).
std::set<std::string> MetricNames(const std::string& text);
// `promtool check metrics` over `text`: its output (empty = no warning), *rc its exit code;
// *rc = -2 when promtool is not installed.
std::string PromtoolCheck(const std::string& text, const std::string& dir, int* rc);

}  // namespace kvstream::testing
