// Logging to stderr: "2026-11-29T09:40:16.123Z I prefill.cc:42 [req 17] message".
// Level from KVSTREAM_LOG_LEVEL (debug, info, warn, error; default info). Thread-safe.
// Every record is one line: control characters in a message are escaped (\n, \xNN; a
// backslash as \\), so a field taken from a request cannot forge a record.
#pragma once

#include <sstream>
#include <string>

namespace kvstream {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel CurrentLogLevel();
void SetLogLevel(LogLevel level);
void LogLine(LogLevel level, const char* file, int line, const std::string& message);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogMessage() { LogLine(level_, file_, line_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace kvstream

#define KV_LOG(level)                                                          \
  if (::kvstream::LogLevel::level < ::kvstream::CurrentLogLevel()) {           \
  } else                                                                       \
    ::kvstream::LogMessage(::kvstream::LogLevel::level, __FILE__, __LINE__).stream()

#define KV_LOG_DEBUG KV_LOG(kDebug)
#define KV_LOG_INFO KV_LOG(kInfo)
#define KV_LOG_WARN KV_LOG(kWarn)
#define KV_LOG_ERROR KV_LOG(kError)
