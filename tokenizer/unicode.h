// UTF-8 and Unicode helpers of the tokenizers: validation, code points, the byte-level alphabet,
// ICU-backed normalization forms and character classes.
//
// Guarantees: every function takes and returns UTF-8; none throws; the ICU calls are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvstream::tokenizer {

// True when `s` is well-formed UTF-8 (no surrogates, no overlong forms, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Length in bytes of the UTF-8 sequence whose lead byte is `lead` (1 for a stray byte).
int Utf8SeqLen(unsigned char lead);

// Decodes the code point at s[i] of valid UTF-8 and advances i past it.
char32_t NextCodePoint(std::string_view s, size_t& i);
// Decodes the last code point of non-empty valid UTF-8, setting its start offset.
char32_t LastCodePoint(std::string_view s, size_t& start);

void AppendUtf8(std::string& out, char32_t cp);

// Replaces each maximal ill-formed subsequence with U+FFFD (as Rust's from_utf8_lossy does).
std::string Utf8Lossy(std::string_view bytes);

// GPT-2's byte-level alphabet: byte b <-> a printable code point.
char32_t ByteToChar(uint8_t b);
// The byte of a byte-level code point, or -1 when `cp` is not one.
int CharToByte(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8; the input is returned unchanged when it is already normalized.
Result<std::string> Normalize(NormalForm form, std::string_view s);

// Rust's char::is_whitespace (White_Space) and char::is_alphanumeric (Alphabetic or N*).
bool IsWhitespace(char32_t cp);
bool IsAlphanumeric(char32_t cp);

}  // namespace kvstream::tokenizer
