// Reads and writes PlannerConfig as a textproto or JSON, and layers one config over another.
//
//   ASSIGN_OR_RETURN(kiln::config::PlannerConfig file, kiln::LoadPlannerConfigFile(path));
//   kiln::config::PlannerConfig config = kiln::DefaultPlannerConfig();
//   kiln::MergePlannerConfig(file, &config);   // the file's fields win
//
// JSON uses the proto's field names (snake_case or lowerCamelCase) and also accepts FastDeploy's
// graph_optimization_config keys, either inside a "graph_optimization_config" object (or a string
// holding one, as FastDeploy's command line takes it) or at the top level:
//
//   FastDeploy key                 kiln field
//   use_cudagraph: false           graph.mode = GRAPH_MODE_NONE
//   use_cudagraph: true            graph.mode = GRAPH_MODE_DECODE (unless cudagraph_only_prefill)
//   cudagraph_only_prefill: true   graph.mode = GRAPH_MODE_PREFILL_ONLY (sizes count tokens)
//   cudagraph_capture_sizes: [..]  graph.capture_sizes
//   max_capture_size: N            graph.max_capture_size (sizes above N are dropped)
//   graph_opt_level: N             accepted and ignored (static-graph compilation; no memory)
//
// Unlike FastDeploy, kiln rejects duplicate sizes and sizes above max_num_seqs instead of dropping
// them silently (set max_capture_size to crop a list). A FastDeploy key that sets what a kiln
// field in the same file also sets is an error, as is any other key. Top-level keys that FastDeploy
// and kiln share (gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, block_size,
// tensor_parallel_size, max_model_len) mean the same thing in both.
//
// Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_CONFIG_CONFIG_LOADER_H_
#define KILN_RUNTIME_CONFIG_CONFIG_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/config/planner_config.pb.h"

namespace kiln {

// Parses a textproto. `source` names the text in error messages (a path, or "--config").
// Returns InvalidArgument with the line, column and the parser's complaint on bad input, and
// naming the field for a value that parses but means nothing: a NaN or infinite number, or an
// enum number the enum does not define. Messages stay on one line and send no terminal escape:
// `source` is escaped as Escaped (quoted.h) does, and the parser's complaint, which may quote
// `text`, as Printable does (its own quotes and backslashes stay as they are).
absl::StatusOr<config::PlannerConfig> ParsePlannerConfigText(absl::string_view text,
                                                             absl::string_view source = "text");

// Parses JSON, FastDeploy's graph_optimization_config keys included (see the file comment).
// 64-bit integers are read exactly, as numbers or strings. Returns InvalidArgument naming the bad
// key or the parser's complaint on bad input; besides what ParsePlannerConfigText refuses, this
// refuses objects and lists nested more than 24 deep, a ' outside a string (JSON strings are
// double-quoted; protobuf would read 'single-quoted' ones), a list inside a list or a null in a
// list (protobuf would flatten or drop them), and one field written under both its names
// ("max_num_seqs" and "maxNumSeqs").
absl::StatusOr<config::PlannerConfig> ParsePlannerConfigJson(absl::string_view json,
                                                             absl::string_view source = "JSON");

// Reads `path` (ReadFileText: a regular file of at most 64 MiB) and parses it: JSON when the name
// ends in ".json" or the text starts with '{', else a textproto; a leading UTF-8 byte order mark
// is skipped. Returns NotFound when the file cannot be opened or read (a directory, a FIFO, a
// device), InvalidArgument when it is too large or does not parse.
absl::StatusOr<config::PlannerConfig> LoadPlannerConfigFile(const std::string& path);

// Returns `config` as a textproto that ParsePlannerConfigText reads back to an equal message.
std::string PlannerConfigToText(const config::PlannerConfig& config);

// Returns `config` as JSON (snake_case names) that ParsePlannerConfigJson reads back to an equal
// message. 64-bit integers are JSON strings, as proto3's JSON mapping prescribes.
std::string PlannerConfigToJson(const config::PlannerConfig& config);

// Layers `overlay` over `*base`: every field set in `overlay` replaces the one in `*base`. A
// repeated field (capture_sizes, prefill_sizes) is replaced as a whole, not appended to. A preset
// named in `overlay` (model_preset, gpu_preset) also drops `*base`'s explicit model or GPU fields,
// so the new preset is not mixed with the old shape.
void MergePlannerConfig(const config::PlannerConfig& overlay, config::PlannerConfig* base);

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_CONFIG_LOADER_H_
