#include "tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <array>

namespace kvstream::tokenizer {

int Utf8SeqLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Length of the well-formed sequence at s[i], or 0 when it is ill-formed (Unicode table 3-7).
static size_t WellFormedLen(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) { n = 3; lo = 0xA0; }
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) n = 3;
  else if (c == 0xED) { n = 3; hi = 0x9F; }
  else if (c == 0xF0) { n = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) { n = 4; hi = 0x8F; }
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    const size_t n = WellFormedLen(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

char32_t NextCodePoint(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const int n = Utf8SeqLen(c);
  if (n == 1 || i + n > s.size()) { ++i; return c; }
  char32_t cp = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

char32_t LastCodePoint(std::string_view s, size_t& start) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  start = i;
  size_t j = i;
  return NextCodePoint(s, j);
}

void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = WellFormedLen(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // The maximal prefix of a well-formed sequence is replaced by one U+FFFD.
    size_t k = i + 1;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int want = Utf8SeqLen(c);
    if (want > 1 && c >= 0xC2 && c <= 0xF4) {
      unsigned char lo = 0x80, hi = 0xBF;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
      for (int m = 1; m < want && k < s.size(); ++m, ++k) {
        const unsigned char t = static_cast<unsigned char>(s[k]);
        if (m == 1 ? (t < lo || t > hi) : (t < 0x80 || t > 0xBF)) break;
      }
    }
    out.append("\xEF\xBF\xBD");
    i = k;
  }
  return out;
}

static bool KeptByte(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

char32_t ByteToChar(uint8_t b) {
  static const auto table = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int x = 0; x < 256; ++x) t[x] = KeptByte(x) ? x : 256 + n++;
    return t;
  }();
  return table[b];
}

int CharToByte(char32_t cp) {
  if (cp < 256) return KeptByte(static_cast<int>(cp)) ? static_cast<int>(cp) : -1;
  if (cp >= 256 + 68) return -1;  // 68 bytes are remapped
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    if (!KeptByte(x) && 256 + n++ == static_cast<int>(cp)) return x;
  }
  return -1;
}

Result<std::string> Normalize(NormalForm form, std::string_view s) {
  bool ascii = true;
  for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNfc: n = icu::Normalizer2::getNFCInstance(err); break;
    case NormalForm::kNfd: n = icu::Normalizer2::getNFDInstance(err); break;
    case NormalForm::kNfkc: n = icu::Normalizer2::getNFKCInstance(err); break;
    case NormalForm::kNfkd: n = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err) || n == nullptr) return Internal(std::string("ICU normalizer: ") + u_errorName(err));
  const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  if (n->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  n->normalizeUTF8(0, piece, sink, nullptr, err);
  if (U_FAILURE(err)) return Internal(std::string("ICU normalization failed: ") + u_errorName(err));
  return out;
}

bool IsWhitespace(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

bool IsAlphanumeric(char32_t cp) {
  const UChar32 c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const int8_t t = u_charType(c);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

}  // namespace kvstream::tokenizer
