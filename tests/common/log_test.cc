// Log records: the text form is one line with control characters escaped; the JSON form
// (--log_format json) is one JSON object per line whatever the message holds.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "common/log_format.h"

namespace kvstream {
namespace {

constexpr int64_t kMs = 1764582016123;  // 2025-12-01T09:40:16.123Z

TEST(LogTest, TextRecordIsOneEscapedLine) {
  EXPECT_EQ(FormatLogRecord(LogFormat::kText, LogLevel::kWarn, "/src/prefill/x.cc", 42,
                            "tag a\nE forged\\", kMs),
            "2025-12-01T09:40:16.123Z W x.cc:42 tag a\\nE forged\\\\");
}

TEST(LogTest, JsonRecordHasEveryField) {
  const std::string r =
      FormatLogRecord(LogFormat::kJson, LogLevel::kInfo, "/src/decode/main.cc", 7, "serving", kMs);
  EXPECT_EQ(r, "{\"time\":\"2025-12-01T09:40:16.123Z\",\"level\":\"info\",\"file\":\"main.cc\","
               "\"line\":7,\"msg\":\"serving\"}");
  const auto j = nlohmann::json::parse(r);
  EXPECT_EQ(j["msg"], "serving");
  EXPECT_EQ(j["line"], 7);
}

TEST(LogTest, JsonRecordSurvivesAnyMessage) {
  // Quotes, backslashes, every control character, DEL, valid UTF-8 of 2-4 bytes, and bytes
  // that are not UTF-8 (a lone continuation byte, a truncated sequence, an overlong '/', a
  // surrogate, a code point above U+10FFFF).
  std::string m = "a\"b\\c{}";
  for (int c = 0; c < 0x20; ++c) m += static_cast<char>(c);
  m += "\x7f" "\xc3\xa9" "\xe2\x82\xac" "\xf0\x9f\x98\x80";
  m += "\x80" "\xe2\x82" "\xc0\xaf" "\xed\xa0\x80" "\xf4\x90\x80\x80" "end";
  const std::string r = FormatLogRecord(LogFormat::kJson, LogLevel::kError, "f.cc", 1, m, kMs);
  EXPECT_EQ(r.find('\n'), std::string::npos);
  for (unsigned char c : r) EXPECT_GE(c, 0x20) << r;
  const auto j = nlohmann::json::parse(r);  // throws on invalid JSON or invalid UTF-8
  const std::string msg = j["msg"];
  EXPECT_EQ(msg.substr(0, 7), "a\"b\\c{}");
  EXPECT_EQ(msg[7], '\0');
  EXPECT_EQ(msg[7 + 10], '\n');
  EXPECT_NE(msg.find("\x7f" "\xc3\xa9" "\xe2\x82\xac" "\xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(msg.substr(msg.size() - 3), "end");
  // Each invalid byte became U+FFFD: 1 + 2 (truncated) + 2 (overlong) + 3 (surrogate) + 4.
  size_t replaced = 0;
  for (size_t p = 0; (p = msg.find("\xef\xbf\xbd", p)) != std::string::npos; p += 3) ++replaced;
  EXPECT_EQ(replaced, 12u);
  EXPECT_EQ(j["level"], "error");
}

TEST(LogTest, FormatIsSettable) {
  const LogFormat before = CurrentLogFormat();
  SetLogFormat(LogFormat::kJson);
  EXPECT_EQ(CurrentLogFormat(), LogFormat::kJson);
  SetLogFormat(before);
}

}  // namespace
}  // namespace kvstream
