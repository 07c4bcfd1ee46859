#include "runtime/config/quoted.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln {

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int more = 0;
    uint32_t code = c;
    if (c >= 0x80) {
      more = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
      if (more < 0 || text.size() - i <= static_cast<size_t>(more)) return false;
      code = c & (0x3f >> more);
      for (int k = 1; k <= more; ++k) {
        const unsigned char next = static_cast<unsigned char>(text[i + k]);
        if ((next & 0xc0) != 0x80) return false;
        code = (code << 6) | (next & 0x3f);
      }
      constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
      if (code < kLeast[more] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
        return false;
      }
    }
    i += 1 + more;
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
