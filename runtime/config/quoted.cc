#include "runtime/config/quoted.h"

#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln {

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
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return IsUtf8(text);
}

std::string Escaped(absl::string_view text) {
  return IsUtf8(text) ? absl::Utf8SafeCHexEscape(text) : absl::CHexEscape(text);
}

std::string Quoted(absl::string_view text, char quote) {
  const std::string q(1, quote);
  return absl::StrCat(q, Escaped(text), q);
}

}  // namespace kiln
