// Checks a tool's command line before absl::ParseCommandLine sees it. absl exits with status 1 on
// an unknown flag or a bad value; kiln's tools exit with 2 for bad flags, with a message that names
// the flag and the fix:
//
//   absl::Status flags = kiln::CheckFlags(argc, argv, "generate");
//   if (!flags.ok()) return Fail(flags, 2);
//   absl::ParseCommandLine(argc, argv);
//
// Thread-compatible (reads the process's flag registry).
#ifndef KILN_TOOLS_CLI_FLAGS_H_
#define KILN_TOOLS_CLI_FLAGS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Returns InvalidArgument for the first argument of argv[1..] that is not a flag (before "--"), an
// unknown flag, a flag without its value, an empty value for a flag that is not a string (an
// optional flag would parse "" as unset, so the default would run silently), or a value the flag
// does not parse; OK otherwise. A --flagfile is read and its lines checked the same way (the
// message names the file and line); it must be a regular file of at most 1 MiB, and flagfiles
// nest at most 8 deep and 64 in all, none inside itself (absl would read such a file until memory
// runs out). absl's other flags (--help, --fromenv, ...) are left to ParseCommandLine. `program`
// names the tool in the message about a stray argument. Values parsed here are set in the flag
// registry (ParseCommandLine sets them again).
absl::Status CheckFlags(int argc, char** argv, absl::string_view program);

// Parses --`flag`'s comma-separated integers, each stripped of spaces and optionally signed. A
// text of nothing but spaces and commas gives an empty list (the caller decides what that means).
// InvalidArgument, ending in `fix`, for an empty entry among others ("1,,8": more likely a typo
// than a wish), or an entry that is not a decimal integer or is out of int's range, however many
// digits it has (said apart).
absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text, absl::string_view flag,
                                              absl::string_view fix);

}  // namespace kiln

#endif  // KILN_TOOLS_CLI_FLAGS_H_
