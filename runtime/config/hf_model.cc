#include "runtime/config/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/config/file_text.h"
#include "runtime/config/hf_config.pb.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using config::hf::HfConfig;
using config::hf::HfRope;
using config::hf::SafetensorsIndex;

// transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config defaults for keys a
// config.json may leave out.
constexpr double kDefaultRopeTheta = 10000.0;
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr int kMistralDefaultKvHeads = 8;
constexpr int kDefaultSlidingWindow = 4096;  // MistralConfig's, Qwen2Config's and Qwen3Config's
constexpr int kQwen3DefaultHeadDim = 128;

constexpr char kConfigFile[] = "config.json";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

// Parses `json`, which JsonScanError passed, into `out`, skipping the keys `out` has no field for.
absl::Status ParseScannedJson(absl::string_view json, absl::string_view source,
                              absl::string_view what, google::protobuf::Message* out) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), out, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Cannot read ", Quoted(source), " as ", what, ": ",
        OneLineJsonError(parsed.message().as_string()), "; fix the file or download it again"));
  }
  return absl::OkStatus();
}

// Parses `json` into `out` as ParseScannedJson does, once JsonScanError passed it: protobuf's time
// grows with the depth (minutes at 100,000), and a ' outside a string would make protobuf's
// strings, and so its depth, other than the ones counted.
absl::Status ParseJson(absl::string_view json, absl::string_view source, absl::string_view what,
                       google::protobuf::Message* out) {
  const std::string refused = JsonScanError(json);
  if (!refused.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Cannot read ", Quoted(source), " as ", what,
                                                   ": ", refused,
                                                   "; fix the file or download it again"));
  }
  return ParseScannedJson(json, source, what, out);
}

absl::StatusOr<config::DType> DTypeFromHf(const HfConfig& c, absl::string_view source) {
  if (c.has_dtype() && c.has_torch_dtype() && c.dtype() != c.torch_dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source), ": \"dtype\" is ", Quoted(c.dtype()), " but \"torch_dtype\" is ",
        Quoted(c.torch_dtype()), "; keep one (the type the safetensors files hold)"));
  }
  if (!c.has_dtype() && !c.has_torch_dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source),
        " has no \"torch_dtype\" (or \"dtype\"); add the type the safetensors files hold, "
        "e.g. \"torch_dtype\": \"bfloat16\""));
  }
  const char* key = c.has_dtype() ? "dtype" : "torch_dtype";
  const std::string& name = c.has_dtype() ? c.dtype() : c.torch_dtype();
  if (name == "bfloat16") return config::DTYPE_BF16;
  if (name == "float16") return config::DTYPE_FP16;
  if (name == "float32") return config::DTYPE_FP32;
  return absl::InvalidArgumentError(absl::StrCat(
      Quoted(source), ": ", key, " ", Quoted(name),
      " is not a type kiln reads; use a checkpoint in \"bfloat16\", or in \"float16\" or "
      "\"float32\", which kiln rounds to bf16 as it loads them"));
}

// Returns the sliding window of a config.json whose model has one, as MistralConfig, Qwen2Config
// and Qwen3Config read it: their default (4096) where the key is absent, none (nullopt) where it is
// null, else the number, which must be positive. `c` is `json` parsed.
absl::StatusOr<std::optional<int>> SlidingWindow(absl::string_view json, const HfConfig& c,
                                                 absl::string_view source) {
  if (c.has_sliding_window()) {
    if (c.sliding_window() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quoted(source), ": sliding_window is ", c.sliding_window(),
                       "; it must be positive, or null for attention over every token"));
    }
    return c.sliding_window();
  }
  // Unset is absent or null; the JSON as a Struct tells which. ParseJson scanned `json` before
  // it parsed `c`: no second scan.
  google::protobuf::Struct keys;
  absl::Status parsed = ParseScannedJson(json, source, "JSON", &keys);
  if (!parsed.ok()) return parsed;
  if (keys.fields().contains("sliding_window")) return std::nullopt;  // null
  return kDefaultSlidingWindow;
}

// Returns whether `r` says anything about scaling (transformers 5's rope_parameters always holds
// rope_theta, and rope_type "default" when there is no scaling).
bool HasScaling(const HfRope& r) {
  const std::string& type = r.has_rope_type() ? r.rope_type() : r.type();
  if (type == "default") return false;
  return r.has_rope_type() || r.has_type() || r.has_factor() || r.has_low_freq_factor() ||
         r.has_high_freq_factor() || r.has_original_max_position_embeddings();
}

// Copies a rope_scaling object field by field; "type" stands in for a missing rope_type.
config::RopeScaling RopeScalingFromHf(const HfRope& r) {
  config::RopeScaling s;
  if (r.has_rope_type()) {
    s.set_rope_type(r.rope_type());
  } else if (r.has_type()) {
    s.set_rope_type(r.type());
  }
  if (r.has_factor()) s.set_factor(r.factor());
  if (r.has_low_freq_factor()) s.set_low_freq_factor(r.low_freq_factor());
  if (r.has_high_freq_factor()) s.set_high_freq_factor(r.high_freq_factor());
  if (r.has_original_max_position_embeddings()) {
    s.set_original_max_position_embeddings(r.original_max_position_embeddings());
  }
  return s;
}

// Names a model after its directory; a Hugging Face cache snapshot
// (models--meta-llama--Llama-3.2-1B/snapshots/<hash>) after the repository it came from.
std::string DisplayName(const std::string& dir) {
  std::error_code error;
  fs::path path = fs::absolute(dir, error);
  if (error) path = dir;
  path = path.lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "a/b/" names b
  const fs::path parent = path.parent_path();
  const std::string repo = parent.parent_path().filename().string();
  if (parent.filename() == "snapshots" && absl::StartsWith(repo, "models--")) {
    return repo.substr(repo.rfind("--") + 2);
  }
  return path.filename().string();
}

bool IsFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);  // follows links, as the cache's blobs are
}

// Returns why `name`, a file name that an index maps `tensor` to, cannot name a file inside the
// model directory (empty, a NUL, an absolute path or a ".." that leaves the directory), or OK.
// The files a link in the directory points to (a Hugging Face cache's blobs) are followed later
// as the links they are.
absl::Status CheckShardName(const std::string& tensor, const std::string& name,
                            const std::string& index_path) {
  const char* problem = nullptr;
  if (name.empty()) {
    problem = "an empty file name";
  } else if (name.find('\0') != std::string::npos) {
    problem = "a file name with a NUL byte";
  } else if (fs::path(name).is_absolute() || fs::path(name).has_root_name()) {
    problem = "an absolute path, outside the model directory";
  } else {
    for (const fs::path& part : fs::path(name)) {
      if (part == "..") problem = "a path with \"..\", which can leave the model directory";
    }
  }
  if (problem == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Quoted(index_path), " maps tensor ", Quoted(tensor), " to ", Quoted(name), ", ", problem,
      "; an index names files in its own directory: download it again"));
}

// The distinct files a sharded checkpoint's index names, as paths in `dir`, sorted.
absl::StatusOr<std::vector<std::string>> ShardFiles(const fs::path& dir) {
  const fs::path index_path = dir / kIndexFile;
  absl::StatusOr<std::string> text = ReadFileText(index_path.string(), "safetensors index");
  if (!text.ok()) return text.status();
  SafetensorsIndex index;
  absl::Status parsed = ParseJson(*text, index_path.string(), "a safetensors index", &index);
  if (!parsed.ok()) return parsed;
  // In tensor order, so that of several bad entries the same one is named every time.
  const std::map<std::string, std::string> entries(index.weight_map().begin(),
                                                   index.weight_map().end());
  std::set<std::string> files;  // lexically normal, so "./a" and "a" are one file
  for (const auto& [tensor, name] : entries) {
    absl::Status checked = CheckShardName(tensor, name, index_path.string());
    if (!checked.ok()) return checked;
    files.insert((dir / fs::path(name).lexically_normal()).string());
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(index_path.string()),
        " names no weight files (its \"weight_map\" is missing or empty); download it again"));
  }
  for (const std::string& file : files) {
    if (!IsFile(file)) {
      return absl::NotFoundError(absl::StrCat(
          "Weight file ", Quoted(file), ", which ", Quoted(index_path.string()),
          " names, does not exist or is not a file; download every shard the index names"));
    }
  }
  return std::vector<std::string>(files.begin(), files.end());
}

// Every *.safetensors file in `dir`, sorted by name.
absl::StatusOr<std::vector<std::string>> SafetensorsIn(const fs::path& dir) {
  std::error_code error;
  fs::directory_iterator it(dir, error);
  std::vector<std::string> files;
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const fs::path& path = it->path();
    if (path.extension() == ".safetensors" && IsFile(path)) files.push_back(path.string());
  }
  if (error) {
    return absl::NotFoundError(absl::StrCat("Cannot list model directory ", Quoted(dir.string()),
                                            ": ", error.message(), "; check its permissions"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<config::ModelShape> ModelShapeFromHfConfigJson(absl::string_view json,
                                                              absl::string_view source,
                                                              absl::string_view name) {
  HfConfig c;
  absl::Status parsed = ParseJson(json, source, "a Hugging Face config.json", &c);
  if (!parsed.ok()) return parsed;

  if (!c.has_model_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(source),
                     " has no \"model_type\"; kiln's model runs Llama-family decoders (model_type "
                     "\"llama\", \"mistral\", \"qwen2\" or \"qwen3\"): give it a transformers "
                     "config.json"));
  }
  const bool mistral = c.model_type() == "mistral";
  const bool qwen2 = c.model_type() == "qwen2";
  const bool qwen3 = c.model_type() == "qwen3";
  if (c.model_type() != "llama" && !mistral && !qwen2 && !qwen3) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source), ": model_type ", Quoted(c.model_type()),
        " is not a Llama-family decoder kiln runs; kiln's model runs model_type \"llama\", "
        "\"mistral\", \"qwen2\" and \"qwen3\""));
  }
  if (c.has_hidden_act() && c.hidden_act() != "silu") {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source), ": hidden_act ", Quoted(c.hidden_act()),
        " is not supported; kiln's MLP is SwiGLU (hidden_act \"silu\"), as Llama's is"));
  }
  if (c.mlp_bias()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source),
        ": mlp_bias is true, which kiln's model does not implement; use a Llama-family "
        "model without MLP bias (\"mlp_bias\": false)"));
  }

  struct Size {
    bool has;
    int value;
    const char* key;
    bool required;
  };
  const Size sizes[] = {
      {c.has_hidden_size(), c.hidden_size(), "hidden_size", true},
      {c.has_num_hidden_layers(), c.num_hidden_layers(), "num_hidden_layers", true},
      {c.has_num_attention_heads(), c.num_attention_heads(), "num_attention_heads", true},
      {c.has_num_key_value_heads(), c.num_key_value_heads(), "num_key_value_heads", false},
      {c.has_head_dim(), c.head_dim(), "head_dim", false},
      {c.has_intermediate_size(), c.intermediate_size(), "intermediate_size", true},
      {c.has_vocab_size(), c.vocab_size(), "vocab_size", true},
  };
  for (const Size& s : sizes) {
    if (!s.has && s.required) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quoted(source), " has no \"", s.key,
                       "\"; every Llama config.json gives it: download the file again"));
    }
    if (s.has && s.value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(Quoted(source), ": ", s.key, " is ", s.value,
                                                     "; it must be positive: fix the file"));
    }
  }
  absl::StatusOr<config::DType> dtype = DTypeFromHf(c, source);
  if (!dtype.ok()) return dtype.status();

  config::ModelShape m;
  if (!name.empty()) {
    m.set_name(std::string(name));
  } else {
    m.set_name(c.architectures_size() > 0 ? c.architectures(0) : c.model_type());
  }
  m.set_hidden_size(c.hidden_size());
  m.set_num_layers(c.num_hidden_layers());
  m.set_num_heads(c.num_attention_heads());
  if (c.has_num_key_value_heads()) {
    m.set_num_kv_heads(c.num_key_value_heads());
  } else {
    m.set_num_kv_heads(mistral ? kMistralDefaultKvHeads : c.num_attention_heads());
  }
  // transformers divides without checking the remainder; so does kiln, to build the same model.
  // Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads.
  if (c.has_head_dim()) {
    m.set_head_dim(c.head_dim());
  } else if (qwen3) {
    m.set_head_dim(kQwen3DefaultHeadDim);
  } else if (c.hidden_size() < c.num_attention_heads()) {
    // The quotient rounds down to 0: no model has heads of no width.
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(source), ": head_dim is absent and hidden_size ", c.hidden_size(),
        " / num_attention_heads ", c.num_attention_heads(),
        " is 0; fix hidden_size or num_attention_heads, or give head_dim"));
  } else {
    m.set_head_dim(c.hidden_size() / c.num_attention_heads());
  }
  m.set_intermediate_size(c.intermediate_size());
  m.set_vocab_size(c.vocab_size());
  m.set_dtype(*dtype);
  m.set_tie_embeddings(c.tie_word_embeddings());
  if (c.has_rope_theta()) {
    m.set_rope_theta(c.rope_theta());
  } else if (c.rope_parameters().has_rope_theta()) {
    m.set_rope_theta(c.rope_parameters().rope_theta());
  } else {
    m.set_rope_theta(kDefaultRopeTheta);
  }
  m.set_rms_norm_eps(c.has_rms_norm_eps() ? c.rms_norm_eps() : kDefaultRmsNormEps);
  // Qwen2's q, k and v projections always have a bias (its config has no attention_bias key).
  m.set_attention_bias(qwen2 || c.attention_bias());
  // Qwen3 norms each query and key head (q_norm, k_norm) before RoPE.
  m.set_qk_norm(qwen3);
  // LlamaConfig has no sliding window (transformers ignores the key there); Qwen2's and Qwen3's
  // apply only with use_sliding_window (to the layers from max_window_layers on: kiln bounds
  // max_model_len by it, which covers any of them).
  if (mistral || ((qwen2 || qwen3) && c.use_sliding_window())) {
    absl::StatusOr<std::optional<int>> window = SlidingWindow(json, c, source);
    if (!window.ok()) return window.status();
    if (window->has_value()) m.set_sliding_window(**window);
  }
  if (c.has_rope_scaling()) {
    // Copied as written, "default" included; the Runner says which kinds it runs.
    *m.mutable_rope_scaling() = RopeScalingFromHf(c.rope_scaling());
  } else if (HasScaling(c.rope_parameters())) {
    *m.mutable_rope_scaling() = RopeScalingFromHf(c.rope_parameters());
  }
  return m;
}

absl::StatusOr<config::ModelShape> LoadHfModelShape(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat(
        "Model directory ", Quoted(dir),
        " does not exist or is not a directory; give the folder that holds the model's "
        "config.json and safetensors files"));
  }
  const fs::path config_path = fs::path(dir) / kConfigFile;
  if (!IsFile(config_path)) {
    return absl::NotFoundError(absl::StrCat(
        "Model directory ", Quoted(dir), " has no config.json (", Quoted(config_path.string()),
        " does not exist); download the model's config.json beside its safetensors files"));
  }
  absl::StatusOr<std::string> text = ReadFileText(config_path.string());
  if (!text.ok()) return text.status();
  return ModelShapeFromHfConfigJson(*text, config_path.string(), DisplayName(dir));
}

absl::StatusOr<HfModel> LoadHfModelDir(const std::string& dir) {
  absl::StatusOr<config::ModelShape> shape = LoadHfModelShape(dir);
  if (!shape.ok()) return shape.status();
  HfModel model;
  model.model = *std::move(shape);

  const fs::path root(dir);
  // An index that is there but cannot be read (a link into a cache whose blob is missing, a
  // directory) is a broken download: the *.safetensors files beside it may be only some shards.
  std::error_code error;
  const fs::file_status index_status = fs::symlink_status(root / kIndexFile, error);
  if (fs::exists(index_status) && !IsFile(root / kIndexFile)) {
    return absl::NotFoundError(absl::StrCat(
        Quoted((root / kIndexFile).string()),
        fs::is_symlink(index_status) && !fs::exists(root / kIndexFile, error)
            ? " is a link to nothing"
            : " is not a regular file",
        "; download the model's ", kIndexFile, " again"));
  }
  if (IsFile(root / kIndexFile)) {
    absl::StatusOr<std::vector<std::string>> shards = ShardFiles(root);
    if (!shards.ok()) return shards.status();
    model.weight_files = *std::move(shards);
  } else if (IsFile(root / kSingleFile)) {
    model.weight_files = {(root / kSingleFile).string()};
  } else {
    absl::StatusOr<std::vector<std::string>> files = SafetensorsIn(root);
    if (!files.ok()) return files.status();
    model.weight_files = *std::move(files);
  }
  if (model.weight_files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "Model directory ", Quoted(dir), " holds no weights: no ", kIndexFile, ", no ", kSingleFile,
        " and no other *.safetensors file; download the model's safetensors files (kiln does "
        "not read .bin or .pth checkpoints)"));
  }
  return model;
}

std::optional<config::DType> RunInBf16(config::ModelShape* model) {
  const config::DType stored = model->dtype();
  if (stored != config::DTYPE_FP16 && stored != config::DTYPE_FP32) return std::nullopt;
  model->set_dtype(config::DTYPE_BF16);
  return stored;
}

}  // namespace kiln
