#include "runtime/config/file_text.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<std::string> ReadFileText(const std::string& path, absl::string_view what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("Cannot open ", what, what.empty() ? "" : " ", "\"",
                                            path, "\": ", std::strerror(errno),
                                            "; check the path"));
  }
  // Read in blocks and check for a failed read: `stream << file.rdbuf()` would turn one (a
  // directory opens like a file on Linux, then fails with EISDIR) into empty text, which parses
  // as an empty config.
  std::string text;
  char block[1 << 16];
  while (file.read(block, sizeof(block)) || file.gcount() > 0) {
    text.append(block, static_cast<size_t>(file.gcount()));
  }
  if (file.bad()) {
    return absl::NotFoundError(absl::StrCat("Cannot read ", what, what.empty() ? "" : " ", "\"",
                                            path, "\": ", std::strerror(errno),
                                            "; check that the path names a readable file"));
  }
  return text;
}

}  // namespace kiln
