// Reads a whole file into a string, for the config readers (PlannerConfig files, Hugging Face
// config.json and safetensors indexes), scans JSON text before a parser reads it, and puts what
// a parser says about such text on one line.
//
//   ASSIGN_OR_RETURN(std::string text, kiln::ReadFileText(path, "config file"));
//
// Only a regular file (or a link to one) of at most `max_bytes` is read: a FIFO would block the
// reader until some other process writes to it, and a device such as /dev/zero never ends.
// Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_CONFIG_FILE_TEXT_H_
#define KILN_RUNTIME_CONFIG_FILE_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// The largest file ReadFileText reads by default. A kiln config or a config.json is a few KiB;
// the safetensors index of a 671B-parameter model is about 9 MiB.
inline constexpr size_t kMaxFileTextBytes = size_t{64} << 20;

// Returns the bytes of the file at `path`. `what` describes the file in errors ("config file");
// empty: the path alone. The path is quoted and escaped in every message (byte by byte where it
// is not UTF-8). Errors:
//   NotFound "Cannot open <what> \"<path>\": <reason>; check the path" when it cannot be opened;
//   NotFound "Cannot read <what> \"<path>\": <reason>; ..." when it is a directory, a FIFO, a
//     device or a socket, or a read fails;
//   InvalidArgument naming the size and the limit when it holds more than `max_bytes`.
absl::StatusOr<std::string> ReadFileText(const std::string& path, absl::string_view what = "",
                                         size_t max_bytes = kMaxFileTextBytes);

// Puts one of protobuf's JSON parse errors on one clean line (see quoted.h). protobuf ends them
// with the text around the error, raw, and a line with a caret under the spot ("Expected a
// value.\n  \"a\": ,\n       ^"): raw, that text can hold any byte of the file (a NUL, a byte
// that is not UTF-8), and a file's own newlines move the caret off the spot. So the text is
// escaped as Printable escapes it (quotes stay quotes, as in the text parser's messages kiln
// shows) and the caret written into it at the spot. A message in any other form is escaped so.
std::string OneLineJsonError(absl::string_view message);

// The JSON scanner the config readers share, for what they check before protobuf's parser reads
// the text (and for the text of each member the FastDeploy rewrite keeps). It steps over strings
// and counts brackets in linear time, without checking that the text is JSON. A JSON string is
// double-quoted only: a ' is a byte like any other here, inside a string or out. protobuf's parser
// also reads 'single-quoted' strings, inside which a bracket or a " means nothing to it, so
// JsonSingleQuoteError finds the text it would read differently.

// Returns the end of the JSON string that opens with the double quote at `json[i]`: the index past
// its closing quote, or npos when the text ends first. A backslash escapes the byte after it.
size_t SkipJsonString(absl::string_view json, size_t i);

// Returns the end of the JSON value that starts at `json[i]`: past a whole string, or an object or
// a list with all it holds; else past a literal (a number, true, false, null), which ends at ',',
// '}', ']', a space or the text's end. npos where a string, an object or a list does not end.
size_t SkipJsonValue(absl::string_view json, size_t i);

// Returns how deep `json`'s objects and arrays nest at their deepest ("{}" 1, "[[1]]" 2),
// counting brackets outside strings only. Linear time: run it before a parser whose time or
// stack grows with the depth.
int JsonNestingDepth(absl::string_view json);

// Returns "" where `json` holds no ' outside its strings, else where the first such one stands
// and why that is refused ("line 2 column 5 holds a ' outside a string: JSON strings take double
// quotes only"), for a message about the text. protobuf's parser would read such a ' as a quote:
// its strings, and so its depth, would not be the ones JsonNestingDepth saw.
std::string JsonSingleQuoteError(absl::string_view json);

// The deepest JSON kiln parses. A PlannerConfig nests 3 deep, a Hugging Face config.json 3 or 4;
// protobuf's parser takes time that grows with the square of the depth of lists it reads into a
// Struct (minutes for a file of 100,000 '['), and past about 30 objects deep it refuses a Struct
// with a message that names nothing.
inline constexpr int kMaxJsonNesting = 24;

// Returns "" where protobuf's parser may read `json`, else why not, for a message about the text:
// JsonSingleQuoteError(json) where that is not "" (a ' decides first: past it, protobuf's depth
// is not the one counted), else, where JsonNestingDepth(json) exceeds kMaxJsonNesting, "its
// objects and lists nest 30 deep, more than the 24 kiln reads". One linear pass over the text:
// run it before every parse of text kiln has not checked.
std::string JsonScanError(absl::string_view json);

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_FILE_TEXT_H_
