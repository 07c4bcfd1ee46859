#include "tools/cli_flags.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kiln {

absl::Status CheckFlags(int argc, char** argv, absl::string_view program) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      return absl::InvalidArgumentError(absl::StrCat("Unexpected argument \"", arg, "\"; ",
                                                     program, " takes only flags (see --help)"));
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    const bool has_value = arg.find('=') != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(arg.find('=') + 1)) : "";
    if (name == "flagfile") {
      // ParseCommandLine would exit with status 1 on a file it cannot open.
      if (!has_value && i + 1 < argc) value = argv[++i];
      for (absl::string_view path : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        // A directory opens like a file on Linux and reads as no lines: refuse it too.
        std::error_code ec;
        if (std::filesystem::is_directory(std::string(path), ec) ||
            !std::ifstream(std::string(path)).good()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "Cannot open --flagfile ", path, "; give a readable file of --flag=value lines"));
        }
      }
      continue;
    }
    if (absl::StartsWith(name, "help") || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok" || name == "version" || name == "only_check_args") {
      continue;  // absl's own flags, handled by ParseCommandLine
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && !has_value) continue;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Unknown flag --", name, "; run with --help to list the flags"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("Flag --", name, " needs a value"));
      }
      value = argv[++i];
    }
    if (value.empty() && !flag->IsOfType<std::string>()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Flag --", name, " is empty; give it a value or leave it out"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Bad value \"", value, "\" for --", name, ": ", error, "; ", flag->Help()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text, absl::string_view flag,
                                              absl::string_view fix) {
  std::vector<int> out;
  bool empty_entry = false;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (piece.empty()) {
      empty_entry = true;
      continue;
    }
    int v = 0;
    if (!absl::SimpleAtoi(piece, &v)) {
      int64_t wide = 0;
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " has \"", piece, "\", which is ",
          absl::SimpleAtoi(piece, &wide) ? "out of range" : "not an integer", fix));
    }
    out.push_back(v);
  }
  if (empty_entry && !out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", text, " has an empty entry", fix));
  }
  return out;
}

}  // namespace kiln
