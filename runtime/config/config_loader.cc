#include "runtime/config/config_loader.h"

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/config/file_text.h"

namespace kiln {
namespace {

using config::PlannerConfig;
using google::protobuf::Struct;
using google::protobuf::Value;

// Keeps the first error the text parser reports, with its position (1-based for people).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    message_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

constexpr absl::string_view kFastDeployGraphKeys[] = {"use_cudagraph", "cudagraph_capture_sizes",
                                                      "cudagraph_only_prefill", "max_capture_size"};

bool IsFastDeployGraphKey(absl::string_view key) {
  for (absl::string_view k : kFastDeployGraphKeys) {
    if (key == k) return true;
  }
  return false;
}

absl::Status GatherGraphOptimizationConfig(const Value& value, absl::string_view source,
                                           std::map<std::string, Value>* keys) {
  Struct parsed;
  const Struct* object = nullptr;
  if (value.kind_case() == Value::kStructValue) {
    object = &value.struct_value();
  } else if (value.kind_case() == Value::kStringValue) {
    // FastDeploy's command line takes the object as a JSON string; accept that spelling too.
    if (!google::protobuf::util::JsonStringToMessage(value.string_value(), &parsed).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph_optimization_config in ", source,
                       " is a string that is not a JSON object; write it as an object, e.g. "
                       "{\"use_cudagraph\": true}"));
    }
    object = &parsed;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("graph_optimization_config in ", source,
                     " must be an object, e.g. {\"use_cudagraph\": true, "
                     "\"cudagraph_capture_sizes\": [1, 2, 4]}"));
  }
  for (const auto& [key, v] : object->fields()) {
    if (key == "graph_opt_level") continue;  // static-graph compilation: no memory of its own
    if (!IsFastDeployGraphKey(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Unsupported key \"", key, "\" in graph_optimization_config of ", source,
          "; kiln reads use_cudagraph, cudagraph_capture_sizes, cudagraph_only_prefill, "
          "max_capture_size (and ignores graph_opt_level): remove it"));
    }
    if (keys->count(key) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", key, "\" is set both at the top level and in graph_optimization_config of ", source,
          "; keep one"));
    }
    (*keys)[key] = v;
  }
  return absl::OkStatus();
}

// Returns whether the kiln object `graph` sets the field `name` (snake_case or lowerCamelCase).
bool HasField(const Struct& graph, absl::string_view snake, absl::string_view camel) {
  return graph.fields().count(std::string(snake)) > 0 ||
         graph.fields().count(std::string(camel)) > 0;
}

absl::Status CheckBool(const std::map<std::string, Value>& keys, const std::string& key,
                       absl::string_view source) {
  auto it = keys.find(key);
  if (it != keys.end() && it->second.kind_case() != Value::kBoolValue) {
    return absl::InvalidArgumentError(absl::StrCat(key, " in ", source, " must be true or false"));
  }
  return absl::OkStatus();
}

// Rewrites FastDeploy's graph_optimization_config keys in `root` into kiln's `graph` object.
absl::Status TranslateFastDeployKeys(Struct* root, absl::string_view source) {
  auto& fields = *root->mutable_fields();
  std::map<std::string, Value> keys;
  for (absl::string_view k : kFastDeployGraphKeys) {
    auto it = fields.find(std::string(k));
    if (it == fields.end()) continue;
    keys[std::string(k)] = it->second;
    fields.erase(it);
  }
  auto gopt = fields.find("graph_optimization_config");
  if (gopt != fields.end()) {
    absl::Status status = GatherGraphOptimizationConfig(gopt->second, source, &keys);
    if (!status.ok()) return status;
    fields.erase(gopt);
  }
  if (fields.count("graph_opt_level") > 0) fields.erase("graph_opt_level");
  if (keys.empty()) return absl::OkStatus();

  Value& graph_value = fields["graph"];
  if (graph_value.kind_case() == Value::KIND_NOT_SET) {
    graph_value.mutable_struct_value();
  } else if (graph_value.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"graph\" in ", source, " must be an object, e.g. {\"mode\": \"GRAPH_MODE_DECODE\"}"));
  }
  Struct& graph = *graph_value.mutable_struct_value();
  auto conflict = [&](absl::string_view fd_key, absl::string_view kiln_field) {
    return absl::InvalidArgumentError(absl::StrCat("Both ", fd_key, " and graph.", kiln_field,
                                                   " are set in ", source, "; keep one"));
  };

  for (const char* key : {"use_cudagraph", "cudagraph_only_prefill"}) {
    absl::Status status = CheckBool(keys, key, source);
    if (!status.ok()) return status;
  }
  const auto use = keys.find("use_cudagraph");
  const auto only_prefill = keys.find("cudagraph_only_prefill");
  const char* mode = nullptr;
  if (use != keys.end() && !use->second.bool_value()) {
    mode = "GRAPH_MODE_NONE";
  } else if (only_prefill != keys.end() && only_prefill->second.bool_value()) {
    mode = "GRAPH_MODE_PREFILL_ONLY";
  } else if (use != keys.end()) {
    mode = "GRAPH_MODE_DECODE";
  }
  if (mode != nullptr) {
    if (HasField(graph, "mode", "mode")) {
      return conflict(use != keys.end() ? "use_cudagraph" : "cudagraph_only_prefill", "mode");
    }
    (*graph.mutable_fields())["mode"].set_string_value(mode);
  }

  const auto sizes = keys.find("cudagraph_capture_sizes");
  if (sizes != keys.end()) {
    if (sizes->second.kind_case() != Value::kListValue) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cudagraph_capture_sizes in ", source, " must be a list of integers, e.g. [1, 2, 4, 8]"));
    }
    if (HasField(graph, "capture_sizes", "captureSizes")) {
      return conflict("cudagraph_capture_sizes", "capture_sizes");
    }
    (*graph.mutable_fields())["capture_sizes"] = sizes->second;
  }

  const auto max_size = keys.find("max_capture_size");
  if (max_size != keys.end()) {
    if (max_size->second.kind_case() != Value::kNumberValue) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_capture_size in ", source, " must be an integer, e.g. 256"));
    }
    if (HasField(graph, "max_capture_size", "maxCaptureSize")) {
      return conflict("max_capture_size", "max_capture_size");
    }
    (*graph.mutable_fields())["max_capture_size"] = max_size->second;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlannerConfig> ParsePlannerConfigText(absl::string_view text,
                                                     absl::string_view source) {
  PlannerConfig config;
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cannot parse ", source, " as a kiln.config.PlannerConfig textproto at ", errors.message(),
        "; fix the file (fields: runtime/config/planner_config.proto)"));
  }
  return config;
}

absl::StatusOr<PlannerConfig> ParsePlannerConfigJson(absl::string_view json,
                                                     absl::string_view source) {
  Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Cannot parse ", source, " as a JSON object: ", parsed.message().as_string(),
                     "; fix the file (a JSON object of kiln.config.PlannerConfig fields)"));
  }
  absl::Status translated = TranslateFastDeployKeys(&root, source);
  if (!translated.ok()) return translated;

  std::string rewritten;
  google::protobuf::util::MessageToJsonString(root, &rewritten);
  PlannerConfig config;
  auto read = google::protobuf::util::JsonStringToMessage(rewritten, &config);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cannot read ", source, " as a kiln.config.PlannerConfig: ", read.message().as_string(),
        "; fix the file (fields: runtime/config/planner_config.proto, plus FastDeploy's "
        "graph_optimization_config keys)"));
  }
  return config;
}

absl::StatusOr<PlannerConfig> LoadPlannerConfigFile(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFileText(path, "config file");
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(text);
  if (absl::EndsWithIgnoreCase(path, ".json") || absl::StartsWith(stripped, "{")) {
    return ParsePlannerConfigJson(text, path);
  }
  return ParsePlannerConfigText(text, path);
}

std::string PlannerConfigToText(const PlannerConfig& config) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return text;
}

std::string PlannerConfigToJson(const PlannerConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Printing a message without Any fields cannot fail.
  google::protobuf::util::MessageToJsonString(config, &json, options);
  return json;
}

void MergePlannerConfig(const PlannerConfig& overlay, PlannerConfig* base) {
  if (overlay.has_model_preset()) base->clear_model();
  if (overlay.has_gpu_preset()) base->clear_gpu();
  if (overlay.graph().capture_sizes_size() > 0) base->mutable_graph()->clear_capture_sizes();
  if (overlay.graph().prefill_sizes_size() > 0) base->mutable_graph()->clear_prefill_sizes();
  base->MergeFrom(overlay);
}

}  // namespace kiln
