#include "runtime/config/file_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

// "config file \"a/b.json\"" or, with no description, "\"a/b.json\"".
std::string Described(absl::string_view what, const std::string& path) {
  return absl::StrCat(what, what.empty() ? "" : " ", Quoted(path));
}

// What a file that is not a regular one is, for the message that refuses it.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "Is a directory";
  if (S_ISFIFO(mode)) return "Is a FIFO (named pipe), which would block until written";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "Is a device, not a regular file";
  if (S_ISSOCK(mode)) return "Is a socket, not a regular file";
  return "Is not a regular file";
}

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Calls `visit(k)` for each byte json[k], k >= i, that lies outside the strings of `json` (each
// string is stepped over whole, by SkipJsonString), until `visit` returns false. Returns the index
// past the byte `visit` stopped at, json.size() where it stopped at none, or npos where a string
// does not end.
template <typename Visit>
size_t WalkOutsideStrings(absl::string_view json, size_t i, Visit visit) {
  while (i < json.size()) {
    if (json[i] == '"') {
      i = SkipJsonString(json, i);
      if (i == absl::string_view::npos) return i;
    } else if (!visit(i++)) {
      return i;
    }
  }
  return json.size();
}

// Returns where the ' at json[quote] stands and why it is refused, for JsonSingleQuoteError and
// JsonScanError.
std::string SingleQuoteAt(absl::string_view json, size_t quote) {
  const absl::string_view before = json.substr(0, quote);
  const size_t newline = before.rfind('\n');
  const size_t column = quote - (newline == absl::string_view::npos ? 0 : newline + 1) + 1;
  return absl::StrCat("line ", std::count(before.begin(), before.end(), '\n') + 1, " column ",
                      column, " holds a ' outside a string: JSON strings take double quotes only");
}

}  // namespace

absl::StatusOr<std::string> ReadFileText(const std::string& path, absl::string_view what,
                                         size_t max_bytes) {
  if (path.find('\0') != std::string::npos) {  // open() would take the part before it
    return absl::NotFoundError(absl::StrCat("Cannot open ", Described(what, path),
                                            ": the path holds a NUL byte; check the path"));
  }
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever if none comes.
  // It is harmless on the regular files read below.
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    return absl::NotFoundError(absl::StrCat("Cannot open ", Described(what, path), ": ",
                                            std::strerror(errno), "; check the path"));
  }
  // A directory opens like a file on Linux and reads as nothing (an empty config, which would
  // plan the defaults as if the file had asked for them); a device may never end.
  struct stat info;
  if (::fstat(file.get(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("Cannot read ", Described(what, path), ": ",
                                            std::strerror(errno),
                                            "; check that the path names a readable file"));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::NotFoundError(absl::StrCat("Cannot read ", Described(what, path), ": ",
                                            KindOf(info.st_mode),
                                            "; check that the path names a readable file"));
  }
  auto too_big = [&](const std::string& size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cannot read ", Described(what, path), ": it holds ", size, " bytes, more than the ",
        max_bytes, " a file of settings may; check that the path names the right file"));
  };
  if (static_cast<uint64_t>(info.st_size) > max_bytes) return too_big(absl::StrCat(info.st_size));
  // Read to the end rather than st_size bytes: a file may grow meanwhile, and files in /proc
  // have a size of 0. The limit still holds.
  std::string text;
  text.reserve(static_cast<size_t>(info.st_size));
  char block[1 << 16];
  while (true) {
    const ssize_t n = ::read(file.get(), block, sizeof(block));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::NotFoundError(absl::StrCat("Cannot read ", Described(what, path), ": ",
                                              std::strerror(errno),
                                              "; check that the path names a readable file"));
    }
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      return too_big(absl::StrCat("more than ", max_bytes));
    }
    text.append(block, static_cast<size_t>(n));
  }
  return text;
}

std::string OneLineJsonError(absl::string_view message) {
  const size_t first = message.find('\n');
  const size_t last = message.rfind('\n');
  if (first == absl::string_view::npos || first == last) return Printable(message);
  const absl::string_view what = absl::StripSuffix(message.substr(0, first), ".");
  const absl::string_view near = message.substr(first + 1, last - first - 1);
  const absl::string_view caret = message.substr(last + 1);
  const size_t at = caret.find_first_not_of(' ');  // a byte of `near`, or its end
  if (at == absl::string_view::npos || caret.substr(at) != "^" || at > near.size()) {
    return Printable(message);
  }
  if (near.empty()) return Printable(what);  // the text ended: nothing to quote
  // The caret goes into the text before it is escaped, so that it stays between the escapes of
  // the bytes either side of the spot. Where the spot splits a character, the text with the caret
  // is not UTF-8 and each of its bytes above 0x7e is escaped, as Printable writes any such text.
  return absl::StrCat(Printable(what), ", at ^ in \"",
                      Printable(absl::StrCat(near.substr(0, at), "^", near.substr(at))), "\"");
}

size_t SkipJsonString(absl::string_view json, size_t i) {
  for (++i; i < json.size(); ++i) {
    if (json[i] == '\\') {
      ++i;  // the escaped byte, a quote included
    } else if (json[i] == '"') {
      return i + 1;
    }
  }
  return absl::string_view::npos;
}

size_t SkipJsonValue(absl::string_view json, size_t i) {
  if (i >= json.size()) return absl::string_view::npos;
  if (json[i] == '"') return SkipJsonString(json, i);
  if (json[i] == '{' || json[i] == '[') {
    int depth = 0;
    const size_t end = WalkOutsideStrings(json, i, [&](size_t k) {
      if (json[k] == '{' || json[k] == '[') ++depth;
      if (json[k] == '}' || json[k] == ']') --depth;
      return depth > 0;
    });
    return depth == 0 ? end : absl::string_view::npos;
  }
  while (i < json.size() && json[i] != ',' && json[i] != '}' && json[i] != ']' &&
         !absl::ascii_isspace(static_cast<unsigned char>(json[i]))) {
    ++i;
  }
  return i;
}

int JsonNestingDepth(absl::string_view json) {
  int depth = 0;
  int deepest = 0;
  WalkOutsideStrings(json, 0, [&](size_t k) {
    if (json[k] == '{' || json[k] == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((json[k] == '}' || json[k] == ']') && depth > 0) {
      --depth;
    }
    return true;
  });
  return deepest;
}

std::string JsonSingleQuoteError(absl::string_view json) {
  size_t quote = absl::string_view::npos;
  WalkOutsideStrings(json, 0, [&](size_t k) {
    if (json[k] != '\'') return true;
    quote = k;
    return false;
  });
  return quote == absl::string_view::npos ? "" : SingleQuoteAt(json, quote);
}

std::string JsonScanError(absl::string_view json) {
  int depth = 0;
  int deepest = 0;
  size_t quote = absl::string_view::npos;
  WalkOutsideStrings(json, 0, [&](size_t k) {
    if (json[k] == '{' || json[k] == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((json[k] == '}' || json[k] == ']') && depth > 0) {
      --depth;
    } else if (json[k] == '\'') {
      quote = k;
      return false;
    }
    return true;
  });
  if (quote != absl::string_view::npos) return SingleQuoteAt(json, quote);
  if (deepest > kMaxJsonNesting) {
    return absl::StrCat("its objects and lists nest ", deepest, " deep, more than the ",
                        kMaxJsonNesting, " kiln reads");
  }
  return "";
}

}  // namespace kiln
