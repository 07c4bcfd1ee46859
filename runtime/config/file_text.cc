#include "runtime/config/file_text.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

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
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace kiln
