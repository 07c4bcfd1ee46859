// Quotes text a user or a file gave, for an error message: C escapes for the quote, backslashes
// and control characters, and for every byte of text that is not UTF-8, so that a newline, a NUL,
// a terminal escape or a stray byte in a config value, a flag or a file header never breaks a
// message's one line.
//
//   return absl::InvalidArgumentError(absl::StrCat("Unknown preset ", kiln::Quoted(name)));
#ifndef KILN_RUNTIME_CONFIG_QUOTED_H_
#define KILN_RUNTIME_CONFIG_QUOTED_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

// Returns the length in bytes (1 to 4) of the well-formed UTF-8 character that starts `text`, or
// 0 where none does: `text` is empty, starts with a byte no character starts with, or with an
// overlong form, a surrogate, a code point past U+10FFFF (RFC 3629) or a character cut short.
size_t Utf8CharLength(absl::string_view text);

// Returns whether `text` is well-formed UTF-8: a sequence of characters Utf8CharLength reads.
// absl's Utf8SafeCHexEscape does not check: it passes every byte above 0x7f through.
bool IsUtf8(absl::string_view text);

// Returns whether `text` is UTF-8 with no control character: one line that sends no terminal
// escape, as Quoted's output always is.
bool IsOneCleanLine(absl::string_view text);

// Returns `text` escaped as above, without quotes.
std::string Escaped(absl::string_view text);

// Returns `text` between `quote` characters, escaped as above.
std::string Quoted(absl::string_view text, char quote = '"');

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_QUOTED_H_
