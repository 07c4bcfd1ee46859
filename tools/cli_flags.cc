#include "tools/cli_flags.h"

#include <cstddef>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/config/file_text.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

// absl reads a --flagfile that names itself (directly or through others) until memory runs out,
// and one that never ends (a device, a pipe) for ever, so CheckFlags reads every flagfile first
// within these bounds. A pipe could not be read twice at all (once here, once by absl).
constexpr int kMaxFlagfileDepth = 8;  // files open inside one another
constexpr int kMaxFlagfiles = 64;     // files read in all (a file may name another twice)
constexpr size_t kMaxFlagfileBytes = size_t{1} << 20;

// One argument and where it came from: the command line (line 0) or a line of a flagfile.
struct Arg {
  std::string text;
  int line = 0;
};

struct FlagfileState {
  std::vector<std::string> open;  // the chain of flagfiles being read, outermost first
  int read = 0;
};

absl::Status CheckArgs(const std::vector<Arg>& args, absl::string_view source,
                       absl::string_view program, FlagfileState* state);

// Prefixes a message about a flagfile's contents with the file and line.
absl::Status InFile(absl::string_view source, int line, const absl::Status& status) {
  if (status.ok() || source.empty()) return status;
  return absl::Status(status.code(), absl::StrCat("--flagfile ", Quoted(source), " line ", line,
                                                  ": ", status.message()));
}

// The flagfiles being read, then `id`, each quoted, joined by " -> ".
std::string Chain(const std::vector<std::string>& open, const std::string& id) {
  std::string chain;
  for (const std::string& file : open) absl::StrAppend(&chain, Quoted(file), " -> ");
  return absl::StrCat(chain, Quoted(id));
}

// Reads the flagfile `path` as absl does (a line per argument, leading spaces stripped, blank and
// '#' lines skipped, every other line a flag) and checks its arguments.
absl::Status CheckFlagfile(const std::string& path, absl::string_view program,
                           FlagfileState* state) {
  // One open that refuses what absl would block on (a FIFO), read for ever (a device) or read as
  // no lines (a directory), and a file over the limit, before a byte is taken from it.
  absl::StatusOr<std::string> text = ReadFileText(path, "--flagfile", kMaxFlagfileBytes);
  if (!text.ok()) {
    // InvalidArgument whatever the cause: it is a bad value of --flagfile.
    return absl::InvalidArgumentError(text.status().message());
  }
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(path, ec);
  const std::string id = ec ? path : canonical.string();
  for (const std::string& open : state->open) {
    if (open == id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--flagfile ", Quoted(path), " is already being read (", Chain(state->open, id),
          "), so it would be read for ever; remove the --flagfile that names it again"));
    }
  }
  if (static_cast<int>(state->open.size()) >= kMaxFlagfileDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("--flagfile ", Quoted(path), " is nested ", state->open.size() + 1,
                     " files deep (", Chain(state->open, id), "); at most ", kMaxFlagfileDepth,
                     " are read inside one another: put the flags in fewer files"));
  }
  if (++state->read > kMaxFlagfiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("More than ", kMaxFlagfiles, " flagfiles are read (the last ", Quoted(path),
                     "); a file that names others more than once multiplies them: name each once"));
  }
  std::vector<Arg> args;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++number;
    absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
    if (stripped.empty() || stripped[0] == '#') continue;
    if (stripped == "--") {
      return InFile(path, number,
                    absl::InvalidArgumentError(
                        "\"--\" ends the flags, which a flagfile cannot do; remove the line"));
    }
    if (stripped[0] != '-') {
      return InFile(path, number,
                    absl::InvalidArgumentError(
                        absl::StrCat(Quoted(stripped),
                                     " is not a flag; write one --flag=value a line, or a "
                                     "# comment")));
    }
    args.push_back({std::string(stripped), number});
  }
  state->open.push_back(id);
  absl::Status status = CheckArgs(args, path, program, state);
  state->open.pop_back();
  return status;
}

absl::Status CheckArgs(const std::vector<Arg>& args, absl::string_view source,
                       absl::string_view program, FlagfileState* state) {
  for (size_t i = 0; i < args.size(); ++i) {
    const int line = args[i].line;
    absl::string_view arg = args[i].text;
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      return InFile(
          source, line,
          absl::InvalidArgumentError(absl::StrCat("Unexpected argument ", Quoted(arg), "; ",
                                                  program, " takes only flags (see --help)")));
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t equals = arg.find('=');
    const std::string name(arg.substr(0, equals));
    const bool has_value = equals != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(equals + 1)) : "";
    if (name == "flagfile") {
      // ParseCommandLine would exit with status 1 on a file it cannot open.
      if (!has_value) {
        if (i + 1 >= args.size()) {
          return InFile(source, line,
                        absl::InvalidArgumentError("Flag --flagfile needs a value: a file of "
                                                   "--flag=value lines"));
        }
        value = args[++i].text;
      }
      if (value.empty()) {
        return InFile(
            source, line,
            absl::InvalidArgumentError("Flag --flagfile is empty; give it a file or leave it out"));
      }
      for (absl::string_view path : absl::StrSplit(value, ',')) {
        if (path.empty()) {
          return InFile(
              source, line,
              absl::InvalidArgumentError(absl::StrCat("--flagfile=", Escaped(value),
                                                      " has an empty entry; list the files "
                                                      "separated by single commas")));
        }
        absl::Status file = CheckFlagfile(std::string(path), program, state);
        if (!file.ok()) return InFile(source, line, file);
      }
      continue;
    }
    if (absl::StartsWith(name, "help") || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok" || name == "version" || name == "only_check_args") {
      continue;  // absl's own flags, handled by ParseCommandLine
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      const std::string positive = name.substr(2);
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(positive);
      if (negated != nullptr && negated->IsOfType<bool>()) {
        if (!has_value) continue;
        return InFile(
            source, line,
            absl::InvalidArgumentError(absl::StrCat("Flag --", name, " takes no value; give --",
                                                    positive, "=false (or --", name, " alone)")));
      }
      if (negated != nullptr) {
        return InFile(source, line,
                      absl::InvalidArgumentError(absl::StrCat(
                          "Flag --", name, ": only plain boolean flags have a --no form; give --",
                          positive, "=VALUE")));
      }
    }
    if (flag == nullptr) {
      return InFile(
          source, line,
          absl::InvalidArgumentError(absl::StrCat("Unknown flag --", Escaped(name),
                                                  "; run with --help to list the flags")));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= args.size()) {
        return InFile(source, line,
                      absl::InvalidArgumentError(absl::StrCat("Flag --", name, " needs a value")));
      }
      value = args[++i].text;
    }
    if (value.empty() && !flag->IsOfType<std::string>()) {
      return InFile(source, line,
                    absl::InvalidArgumentError(absl::StrCat(
                        "Flag --", name, " is empty; give it a value or leave it out")));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return InFile(
          source, line,
          absl::InvalidArgumentError(absl::StrCat("Bad value ", Quoted(value), " for --", name,
                                                  ": ", Printable(error), "; ", flag->Help())));
    }
  }
  return absl::OkStatus();
}

// True for an optional sign and then decimal digits only: an integer, however long.
bool IsDecimal(absl::string_view text) {
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckFlags(int argc, char** argv, absl::string_view program) {
  std::vector<Arg> args;
  for (int i = 1; i < argc; ++i) args.push_back({argv[i], 0});
  FlagfileState state;
  return CheckArgs(args, "", program, &state);
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
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " has ", Quoted(piece), ", which is ",
                       IsDecimal(piece) ? "out of range" : "not an integer", fix));
    }
    out.push_back(v);
  }
  if (empty_entry && !out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", Escaped(text), " has an empty entry", fix));
  }
  return out;
}

}  // namespace kiln
