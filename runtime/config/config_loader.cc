#include "runtime/config/config_loader.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/config/file_text.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

using config::PlannerConfig;
using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::ListValue;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::Struct;
using google::protobuf::Value;

// Returns the text parser's `message` as the end of a clause. The parser ends a sentence of its
// own with a period ("Message type \"a.B\" has no field named \"x\".", "... Value: \"yes\"."),
// which is dropped; but a tokenizer message ends with the token as the file writes it, after
// "got: " ("Expected integer, got: 8."), and keeps its last byte. An empty token there is the end
// of the text. Only what is not printable is escaped, so the parser's quotes read as quotes.
std::string ParserClause(absl::string_view message) {
  if (absl::EndsWith(message, ": ")) return Printable(absl::StrCat(message, "the end of the text"));
  if (!absl::StrContains(message, "got: ")) message = absl::StripSuffix(message, ".");
  return Printable(message);
}

// Keeps the first error the text parser reports, with its position (1-based for people), as
// ParserClause writes it.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    message_ =
        absl::StrCat("line ", line + 1, " column ", column + 1, ": ", ParserClause(message));
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
    const std::string refused = JsonScanError(value.string_value());
    if (!refused.empty() ||
        !google::protobuf::util::JsonStringToMessage(value.string_value(), &parsed).ok()) {
      // The scan's reason is said of the string: "its line 1 column 2 holds a '...", "its
      // objects and lists nest 30 deep...".
      const absl::string_view its = absl::StartsWith(refused, "its ") ? "" : "its ";
      return absl::InvalidArgumentError(absl::StrCat(
          "graph_optimization_config in ", source, " is a string that is not a JSON object",
          refused.empty() ? "" : absl::StrCat(" (", its, refused, ")"),
          "; write it as an object, e.g. {\"use_cudagraph\": true}"));
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
          "Unsupported key ", Quoted(key), " in graph_optimization_config of ", source,
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
// Sets `*changed` when `root` had any.
absl::Status TranslateFastDeployKeys(Struct* root, absl::string_view source, bool* changed) {
  auto& fields = *root->mutable_fields();
  const size_t members = fields.size();
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
  *changed = fields.size() != members;
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

// Refuses what protobuf's JSON parser would read without a word: a list inside a list (it
// flattens [[1], [2, 3]] into [1, 2, 3]) and a null in a list (it drops it). No PlannerConfig
// field takes either. `path` names `value` ("graph.capture_sizes").
absl::Status CheckJsonValue(const Value& value, const std::string& path, absl::string_view source) {
  if (value.kind_case() == Value::kStructValue) {
    for (const auto& [key, field] : value.struct_value().fields()) {
      absl::Status status =
          CheckJsonValue(field, path.empty() ? key : absl::StrCat(path, ".", key), source);
      if (!status.ok()) return status;
    }
  } else if (value.kind_case() == Value::kListValue) {
    const ListValue& list = value.list_value();
    for (int i = 0; i < list.values_size(); ++i) {
      const Value& item = list.values(i);
      if (item.kind_case() == Value::kListValue || item.kind_case() == Value::kNullValue) {
        return absl::InvalidArgumentError(
            absl::StrCat(Escaped(path), "[", i, "] in ", source, " is ",
                         item.kind_case() == Value::kNullValue ? "null" : "a list inside a list",
                         "; write a flat list of numbers, e.g. [1, 2, 4]"));
      }
      absl::Status status = CheckJsonValue(item, absl::StrCat(path, "[", i, "]"), source);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

// Refuses an object of `json` that sets one field of `type` under both of its names
// ("max_num_seqs" and "maxNumSeqs"): protobuf's complaint names neither the field nor the file.
absl::Status CheckFieldSpellings(const Struct& json, const Descriptor& type,
                                 const std::string& path, absl::string_view source) {
  std::map<const FieldDescriptor*, std::string> seen;
  for (const auto& [key, value] : json.fields()) {
    const FieldDescriptor* field = type.FindFieldByName(key);
    if (field == nullptr) {
      field = type.FindFieldByCamelcaseName(key);
      if (field == nullptr || field->json_name() != key) continue;  // unknown: protobuf names it
    }
    if (!seen.emplace(field, key).second) {  // the other spelling came first
      return absl::InvalidArgumentError(absl::StrCat(source, " sets ", path, field->name(),
                                                     " twice, as ", Quoted(field->name()), " and ",
                                                     Quoted(field->json_name()), "; keep one"));
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated() &&
        value.kind_case() == Value::kStructValue) {
      absl::Status status = CheckFieldSpellings(value.struct_value(), *field->message_type(),
                                                absl::StrCat(path, field->name(), "."), source);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

// Refuses values that parse but mean nothing: a number where a double is infinite or NaN (the
// text format reads "nan" and "inf", JSON "NaN" and "Infinity"), an enum number the enum does
// not define (proto3 keeps unknown ones, e.g. "kv_cache_dtype": 99), and a string that is not
// UTF-8 (the text format takes any bytes; such a config would not print as JSON). `path`
// prefixes the field names ("model.").
absl::Status CheckParsedValues(const Message& message, const std::string& path,
                               absl::string_view source) {
  const Reflection& reflection = *message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string name = absl::StrCat(path, field->name());
    const int count = field->is_repeated() ? reflection.FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string at = field->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE: {
          const double v = field->is_repeated() ? reflection.GetRepeatedDouble(message, field, i)
                                                : reflection.GetDouble(message, field);
          if (!std::isfinite(v)) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, " in ", source, " is ", v, "; give a finite number"));
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_ENUM: {
          const int v = field->is_repeated() ? reflection.GetRepeatedEnumValue(message, field, i)
                                             : reflection.GetEnumValue(message, field);
          if (field->enum_type()->FindValueByNumber(v) == nullptr) {
            std::vector<std::string> names;
            for (int e = 0; e < field->enum_type()->value_count(); ++e) {
              if (field->enum_type()->value(e)->number() != 0) {
                names.push_back(field->enum_type()->value(e)->name());
              }
            }
            return absl::InvalidArgumentError(absl::StrCat(
                at, " in ", source, " is ", v, ", which is no ", field->enum_type()->name(),
                "; use one of ", absl::StrJoin(names, ", ")));
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_STRING: {
          std::string scratch;
          const std::string& v =
              field->is_repeated()
                  ? reflection.GetRepeatedStringReference(message, field, i, &scratch)
                  : reflection.GetStringReference(message, field, &scratch);
          if (field->type() == FieldDescriptor::TYPE_STRING && !IsUtf8(v)) {
            return absl::InvalidArgumentError(absl::StrCat(at, " in ", source, " is ", Quoted(v),
                                                           ", which is not UTF-8 text; write it "
                                                           "in UTF-8"));
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE: {
          absl::Status status = CheckParsedValues(
              field->is_repeated() ? reflection.GetRepeatedMessage(message, field, i)
                                   : reflection.GetMessage(message, field),
              absl::StrCat(at, "."), source);
          if (!status.ok()) return status;
          break;
        }
        default:
          break;
      }
    }
  }
  return absl::OkStatus();
}

// One member of a JSON object's top level, as the file writes it.
struct RawMember {
  std::string key;         // decoded ("a" for "\u0061")
  absl::string_view text;  // the member, key and value
};

// Splits the top level of `json`, an object protobuf has parsed, into its members, each as its
// text. False where the text is of a form this does not follow (the caller then does without).
bool SplitTopLevel(absl::string_view json, std::vector<RawMember>* members) {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < json.size() && absl::ascii_isspace(static_cast<unsigned char>(json[i]))) ++i;
  };
  skip_space();
  if (i >= json.size() || json[i] != '{') return false;
  ++i;
  while (true) {
    skip_space();
    if (i >= json.size()) return false;
    if (json[i] == '}') break;
    const size_t begin = i;
    size_t key_end = i;
    if (json[i] == '"') {
      key_end = SkipJsonString(json, i);
    } else {  // an unquoted key, which protobuf's parser also reads
      while (key_end < json.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(json[key_end])) ||
              json[key_end] == '_')) {
        ++key_end;
      }
    }
    if (key_end == absl::string_view::npos || key_end == begin) return false;
    // The key as protobuf reads it: parse it alone.
    Struct one;
    if (!google::protobuf::util::JsonStringToMessage(
             absl::StrCat("{", json.substr(begin, key_end - begin), ": 0}"), &one)
             .ok() ||
        one.fields_size() != 1) {
      return false;
    }
    i = key_end;
    skip_space();
    if (i >= json.size() || json[i] != ':') return false;
    ++i;
    skip_space();
    const size_t value_end = SkipJsonValue(json, i);
    if (value_end == absl::string_view::npos || value_end == i) return false;
    members->push_back({one.fields().begin()->first, json.substr(begin, value_end - begin)});
    i = value_end;
    skip_space();
    if (i < json.size() && json[i] == ',') {
      ++i;
    } else if (i >= json.size() || json[i] != '}') {
      return false;
    }
  }
  return true;
}

// Returns the JSON to read into a PlannerConfig once TranslateFastDeployKeys has turned `json`
// into `root`. Every member of `json` that `root` keeps is copied as the file writes it, and
// only the "graph" object, the one the translation writes to, comes from `root`: a number in a
// Struct is a double, which would round a 64-bit integer above 2^53 (a uint64 byte count of
// Calibration or GpuSpec) to another value, or past the uint64 range.
std::string RewrittenJson(absl::string_view json, const Struct& root) {
  std::vector<RawMember> members;
  if (!SplitTopLevel(json, &members)) {
    std::string rewritten;  // every number through a double: exact for all but such integers
    google::protobuf::util::MessageToJsonString(root, &rewritten);
    return rewritten;
  }
  std::vector<std::string> kept;
  std::set<std::string> keys;
  for (const RawMember& member : members) {
    if (member.key != "graph" && root.fields().contains(member.key)) {
      kept.emplace_back(member.text);
      keys.insert(member.key);
    }
  }
  auto graph = root.fields().find("graph");
  // Every member `root` keeps must have been found once, or the text was not split as protobuf
  // read it.
  if (keys.size() != kept.size() ||
      keys.size() + (graph != root.fields().end() ? 1 : 0) != root.fields().size()) {
    std::string rewritten;
    google::protobuf::util::MessageToJsonString(root, &rewritten);
    return rewritten;
  }
  if (graph != root.fields().end()) {
    std::string text;
    google::protobuf::util::MessageToJsonString(graph->second, &text);
    kept.push_back(absl::StrCat("\"graph\": ", text));
  }
  return absl::StrCat("{", absl::StrJoin(kept, ", "), "}");
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
        "Cannot parse ", Escaped(source), " as a kiln.config.PlannerConfig textproto at ",
        errors.message(), "; fix the file (fields: runtime/config/planner_config.proto)"));
  }
  absl::Status status = CheckParsedValues(config, "", Escaped(source));
  if (!status.ok()) return status;
  return config;
}

absl::StatusOr<PlannerConfig> ParsePlannerConfigJson(absl::string_view json,
                                                     absl::string_view source_text) {
  const std::string source = Escaped(source_text);
  const std::string refused = JsonScanError(json);
  if (!refused.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Cannot parse ", source, " as a JSON object: ", refused,
                     "; fix the file (a JSON object of kiln.config.PlannerConfig fields)"));
  }
  Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Cannot parse ", source,
                     " as a JSON object: ", OneLineJsonError(parsed.message().as_string()),
                     "; fix the file (a JSON object of kiln.config.PlannerConfig fields)"));
  }
  bool translated = false;
  absl::Status status = TranslateFastDeployKeys(&root, source, &translated);
  if (!status.ok()) return status;
  Value whole;
  *whole.mutable_struct_value() = root;
  status = CheckJsonValue(whole, "", source);
  if (!status.ok()) return status;
  status = CheckFieldSpellings(root, *PlannerConfig::descriptor(), "", source);
  if (!status.ok()) return status;

  // Without FastDeploy keys the file is read as it is written; with them, rewritten.
  const std::string rewritten = translated ? RewrittenJson(json, root) : std::string(json);
  PlannerConfig config;
  auto read = google::protobuf::util::JsonStringToMessage(rewritten, &config);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cannot read ", source,
        " as a kiln.config.PlannerConfig: ", OneLineJsonError(read.message().as_string()),
        "; fix the file (fields: runtime/config/planner_config.proto, plus FastDeploy's "
        "graph_optimization_config keys)"));
  }
  status = CheckParsedValues(config, "", source);
  if (!status.ok()) return status;
  return config;
}

absl::StatusOr<PlannerConfig> LoadPlannerConfigFile(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFileText(path, "config file");
  if (!read.ok()) return read.status();
  // A byte order mark, as some Windows editors write: neither parser reads one.
  const absl::string_view text = absl::StripPrefix(*read, "\xEF\xBB\xBF");
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
