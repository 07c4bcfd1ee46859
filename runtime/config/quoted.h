// Quotes text a user or a file gave, for an error message: C escapes for the quote, backslashes
// and control characters, and for every byte of text that is not UTF-8, so that a newline, a NUL,
// a terminal escape or a stray byte in a config value, a flag or a file header never breaks a
// message's one line.
//
//   return absl::InvalidArgumentError(absl::StrCat("Unknown preset ", kiln::Quoted(name)));
#ifndef KILN_RUNTIME_CONFIG_QUOTED_H_
#define KILN_RUNTIME_CONFIG_QUOTED_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

// Returns whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). absl's Utf8SafeCHexEscape does not check: it passes every byte above 0x7f through.
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
