// Quotes text a user or a file gave, for an error message: C escapes for the quote, backslashes,
// control characters and bytes that are not UTF-8, so that a newline, a NUL or a terminal escape
// in a config value, a flag or a file header never breaks a message's one line.
//
//   return absl::InvalidArgumentError(absl::StrCat("Unknown preset ", kiln::Quoted(name)));
#ifndef KILN_RUNTIME_CONFIG_QUOTED_H_
#define KILN_RUNTIME_CONFIG_QUOTED_H_

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Returns `text` between `quote` characters, escaped as above.
inline std::string Quoted(absl::string_view text, char quote = '"') {
  const std::string q(1, quote);
  return absl::StrCat(q, absl::Utf8SafeCHexEscape(text), q);
}

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_QUOTED_H_
