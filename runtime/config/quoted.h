// Quotes text a user or a file gave, for an error message: C escapes for the quote, backslashes
// and the characters that are not printable, and for every byte of text that is not UTF-8, so that
// a newline, a NUL, a terminal escape or a stray byte in a config value, a flag or a file header
// never breaks a message's one line.
//
// Not printable here: the C0 control characters (U+0000..U+001F), DEL (U+007F), the C1 control
// characters (U+0080..U+009F: a terminal may read U+009B as CSI, U+0085 as a new line), the
// line and paragraph separators U+2028 and U+2029, and the bidirectional controls: the
// embeddings and overrides U+202A..U+202E, the isolates U+2066..U+2069 and the marks U+200E,
// U+200F and U+061C, with which a terminal shows the text around them in another order (a path
// that reads as some other path). Each ASCII one is written as \n, \r, \t or \xHH (as
// absl::CHexEscape writes it), each other one as \uHHHH (its code point: "\u0085"). Any other
// UTF-8 character ("é", "日本") is shown as it is. Text that is not UTF-8 has every byte
// above 0x7e written as \xHH, for its bytes may be of some other encoding.
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
bool IsUtf8(absl::string_view text);

// Returns whether `text` is UTF-8 with no character that is not printable (see above): one line
// that sends no terminal escape and is shown in the order it is written, as the output of Quoted,
// Escaped and Printable always is.
bool IsOneCleanLine(absl::string_view text);

// Returns `text` escaped as above, without quotes: a C string literal's contents.
std::string Escaped(absl::string_view text);

// Returns `text` with only what is not printable escaped, as above; quotes and backslashes stay
// as they are. For a parser's message put into one of kiln's ("has no field named \"x\""): the
// parser quotes the text for people, and escaping its quotes would only clutter the message.
std::string Printable(absl::string_view text);

// Returns `text` between `quote` characters, escaped as above.
std::string Quoted(absl::string_view text, char quote = '"');

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_QUOTED_H_
