#include "common/log.h"
#include "common/log_format.h"

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

namespace {
std::atomic<int>& Format() {
  static std::atomic<int> format{[] {
    const char* v = std::getenv("KVSTREAM_LOG_FORMAT");
    return static_cast<int>(v && !std::strcmp(v, "json") ? LogFormat::kJson : LogFormat::kText);
  }()};
  return format;
}

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF included).
size_t Utf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
    return 0;
  return n;
}
}  // namespace

LogFormat CurrentLogFormat() { return static_cast<LogFormat>(Format().load(std::memory_order_relaxed)); }
void SetLogFormat(LogFormat format) { Format().store(static_cast<int>(format)); }

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const size_t n = Utf8Length(s, i); n > 0) {
      out.append(s, i, n);
      i += n;
      continue;
    } else {
      out += "\\ufffd";
    }
    ++i;
  }
  return out;
}

std::string FormatLogRecord(LogFormat format, LogLevel level, const char* file, int line,
                            const std::string& message, int64_t unix_ms) {
  static const char kLetters[] = {'D', 'I', 'W', 'E'};
  static const char* const kNames[] = {"debug", "info", "warn", "error"};
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[40];
  const size_t n = std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(ts + n, sizeof(ts) - n, ".%03dZ", static_cast<int>(unix_ms % 1000));
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  const int l = static_cast<int>(level);
  if (format == LogFormat::kJson) {
    return std::string("{\"time\":\"") + ts + "\",\"level\":\"" + kNames[l] + "\",\"file\":\"" +
           JsonEscape(base) + "\",\"line\":" + std::to_string(line) + ",\"msg\":\"" +
           JsonEscape(message) + "\"}";
  }
  return std::string(ts) + " " + kLetters[l] + " " + base + ":" + std::to_string(line) + " " +
         EscapeControl(message);
}

void LogLine(LogLevel level, const char* file, int line, const std::string& message) {
  static std::mutex mu;
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  const std::string record = FormatLogRecord(CurrentLogFormat(), level, file, line, message, ms) + "\n";
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(record.data(), 1, record.size(), stderr);
}

}  // namespace kvstream
