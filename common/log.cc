#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace kvstream {
namespace {

LogLevel LevelFromEnv() {
  const char* v = std::getenv("KVSTREAM_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

// One record, one line: control characters (a newline in a client's request tag, say) are
// written as \n, \r, \t or \xNN, and a backslash as \\, so no field can forge a record.
std::string EscapeControl(const std::string& m) {
  bool clean = true;
  for (unsigned char c : m)
    if (c < 0x20 || c == 0x7f || c == '\\') clean = false;
  if (clean) return m;
  std::string out;
  out.reserve(m.size() + 8);
  for (unsigned char c : m) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }
void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }

void LogLine(LogLevel level, const char* file, int line, const std::string& message) {
  static std::mutex mu;
  static const char kLetters[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s.%03dZ %c %s:%d %s\n", ts, ms, kLetters[static_cast<int>(level)], base,
               line, EscapeControl(message).c_str());
}

}  // namespace kvstream
