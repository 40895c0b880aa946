// The form of log records (common/log.h writes them). LogFormat::kText, the default:
// "2026-11-29T09:40:16.123Z I prefill.cc:42 [req 17] message", control characters escaped.
// LogFormat::kJson (KVSTREAM_LOG_FORMAT=json, or the daemons' --log_format json): one JSON object
// per line, {"time":"2026-11-29T09:40:16.123Z","level":"info","file":"prefill.cc","line":42,
// "msg":"[req 17] message"}, escaped as JSON wants (quotes, backslashes, control characters as
// \n, \t, ... or \u00XX; bytes that are not UTF-8 become \ufffd), so whatever a message holds,
// each line parses as one object.
#pragma once

#include <cstdint>
#include <string>

#include "common/log.h"

namespace kvstream {

enum class LogFormat { kText = 0, kJson = 1 };

LogFormat CurrentLogFormat();
void SetLogFormat(LogFormat format);

// The record LogLine writes for `message` at `unix_ms`, without the trailing newline.
std::string FormatLogRecord(LogFormat format, LogLevel level, const char* file, int line,
                            const std::string& message, int64_t unix_ms);
// `s` as the body of a JSON string (without the quotes).
std::string JsonEscape(const std::string& s);

}  // namespace kvstream
