// Reads a whole file into a string, for the config readers (PlannerConfig files, Hugging Face
// config.json and safetensors indexes).
//
//   ASSIGN_OR_RETURN(std::string text, kiln::ReadFileText(path, "config file"));
//
// NotFound names the file (as "Cannot open <what> \"<path>\": <reason>; check the path") when it
// cannot be opened, or cannot be read (e.g. a directory). Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_CONFIG_FILE_TEXT_H_
#define KILN_RUNTIME_CONFIG_FILE_TEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// `what` describes the file in the error ("config file"); empty: the path alone.
absl::StatusOr<std::string> ReadFileText(const std::string& path, absl::string_view what = "");

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_FILE_TEXT_H_
