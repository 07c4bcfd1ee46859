#include "runtime/config/quoted.h"

#include <cstddef>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// Returns the code point of the `n`-byte UTF-8 character `text` starts with (n: Utf8CharLength).
char32_t CodePoint(absl::string_view text, size_t n) {
  static constexpr unsigned char kLeadBits[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
  char32_t c = static_cast<unsigned char>(text[0]) & kLeadBits[n];
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (static_cast<unsigned char>(text[i]) & 0x3f);
  return c;
}

// Returns whether the character `c` is not printable (see quoted.h): a C0 or C1 control
// character, DEL, a line or paragraph separator, or a bidirectional control.
bool IsUnprintable(char32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x2028 || c == 0x2029 ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069) || c == 0x200e ||
         c == 0x200f || c == 0x061c;
}

// Escapes `text` as quoted.h says; quotes and backslashes too where `quotes_too`.
std::string Escape(absl::string_view text, bool quotes_too) {
  const bool utf8 = IsUtf8(text);
  std::string out;
  out.reserve(text.size());
  bool after_hex = false;  // the last thing written is \xHH, which a hex digit would extend in C
  while (!text.empty()) {
    const size_t n = utf8 ? Utf8CharLength(text) : 1;
    const unsigned char b = static_cast<unsigned char>(text[0]);
    bool hex = false;
    if (n > 1) {  // a UTF-8 character beyond ASCII
      const char32_t c = CodePoint(text, n);
      if (IsUnprintable(c)) {
        absl::StrAppend(&out, "\\u", absl::Hex(c, absl::kZeroPad4));
      } else {
        out.append(text.data(), n);
      }
    } else if (b == '\n') {
      out += "\\n";
    } else if (b == '\r') {
      out += "\\r";
    } else if (b == '\t') {
      out += "\\t";
    } else if (quotes_too && (b == '"' || b == '\'' || b == '\\')) {
      out += '\\';
      out += static_cast<char>(b);
    } else if (b < 0x20 || b >= 0x7f || (after_hex && absl::ascii_isxdigit(b))) {
      absl::StrAppend(&out, "\\x", absl::Hex(b, absl::kZeroPad2));
      hex = true;
    } else {
      out += static_cast<char>(b);
    }
    after_hex = hex;
    text.remove_prefix(n);
  }
  return out;
}

}  // namespace

size_t Utf8CharLength(absl::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;  // below: an overlong form
    if (b0 == 0xed) hi = 0x9f;  // above: a surrogate
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;  // below: an overlong form
    if (b0 == 0xf4) hi = 0x8f;  // above: past U+10FFFF
  } else {
    return 0;  // a continuation byte, an overlong lead (0xc0, 0xc1), or past U+10FFFF
  }
  if (text.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return n;
}

bool IsUtf8(absl::string_view text) {
  while (!text.empty()) {
    const size_t n = Utf8CharLength(text);
    if (n == 0) return false;
    text.remove_prefix(n);
  }
  return true;
}

bool IsOneCleanLine(absl::string_view text) {
  while (!text.empty()) {
    const size_t n = Utf8CharLength(text);
    if (n == 0 || IsUnprintable(CodePoint(text, n))) return false;
    text.remove_prefix(n);
  }
  return true;
}

std::string Escaped(absl::string_view text) { return Escape(text, /*quotes_too=*/true); }

std::string Printable(absl::string_view text) { return Escape(text, /*quotes_too=*/false); }

std::string Quoted(absl::string_view text, char quote) {
  const std::string q(1, quote);
  return absl::StrCat(q, Escaped(text), q);
}

}  // namespace kiln
