// Reads a Hugging Face model directory (a download of e.g. meta-llama/Llama-3.2-1B): the model's
// shape from config.json, and the safetensors files that hold its weights.
//
//   ASSIGN_OR_RETURN(kiln::HfModel hf, kiln::LoadHfModelDir("/models/Llama-3.2-1B"));
//   kiln::RunnerOptions options;
//   *options.config.mutable_model() = hf.model;   // instead of a model_preset
//   options.weight_files = hf.weight_files;
//
// config.json is read as transformers' LlamaConfig reads it (MistralConfig, for model_type
// "mistral": its defaults of 8 KV heads and a sliding window of 4096 tokens, which a null
// "sliding_window" turns off; Qwen2Config, for "qwen2": QKV bias always, a sliding window only
// with "use_sliding_window": true; Qwen3Config, for "qwen3": q and k heads RMS-normed before
// RoPE (ModelShape.qk_norm), head_dim 128 when absent, a sliding window only with
// "use_sliding_window": true): model_type must be "llama", "mistral", "qwen2" or "qwen3"; the
// sizes (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size) and
// the weights' type (torch_dtype, or dtype in newer files) are required; the other keys take
// LlamaConfig's defaults when absent (num_key_value_heads: num_attention_heads, head_dim:
// hidden_size / num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings,
// attention_bias and mlp_bias false, hidden_act "silu"), so every field of the returned
// ModelShape is set (rope_scaling only where the file has one). transformers 5's
// "rope_parameters" (rope_theta and the scaling in one object) is read too. Keys kiln has no use
// for (bos_token_id, max_position_embeddings, ...) are ignored.
//
// What this accepts, the model may still refuse: the Runner runs bf16 weights with rope_type
// "llama3" or "default" and heads its decode attention has a kernel for (LlamaShapeFromConfig
// says why), and a sliding window only as long as max_model_len (CheckSlidingWindow); the memory
// planner sizes any of them.
//
// Thread-safe; no CUDA.
#ifndef KILN_RUNTIME_CONFIG_HF_MODEL_H_
#define KILN_RUNTIME_CONFIG_HF_MODEL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/config/model_shape.pb.h"

namespace kiln {

// A Hugging Face model directory, read: its shape and its weight files.
struct HfModel {
  config::ModelShape model;               // every field set; name: the directory's name
  std::vector<std::string> weight_files;  // full paths, sorted, each one existing
};

// Parses the text of a config.json into kiln's ModelShape (see the file comment for the keys).
// `source` names the text in error messages (a path), quoted and escaped as quoted.h's Quoted
// writes it ("models/x/config.json"); `name` becomes the shape's display name (empty: the first
// of "architectures", else model_type). Returns InvalidArgument naming the
// key and the fix for a model that is not a Llama, a missing size, an unknown dtype, a key of the
// wrong type, or text that is not JSON.
absl::StatusOr<config::ModelShape> ModelShapeFromHfConfigJson(absl::string_view json,
                                                              absl::string_view source,
                                                              absl::string_view name = "");

// Reads `dir`/config.json into a ModelShape named after the directory (a Hugging Face cache
// snapshot, models--org--name/snapshots/<hash>, is named after the model). Needs no weight
// files, so a memory plan can be made before they are downloaded. Returns NotFound naming the
// path when the directory or its config.json is missing, else what ModelShapeFromHfConfigJson
// returns.
absl::StatusOr<config::ModelShape> LoadHfModelShape(const std::string& dir);

// Reads `dir`'s shape (LoadHfModelShape) and finds its weight files:
//   - model.safetensors.index.json (a sharded checkpoint): the distinct files of its weight_map;
//   - else model.safetensors;
//   - else every *.safetensors file in `dir`, sorted by name.
// Each index entry must name a file inside `dir` (a subfolder is fine, and so is a link, as a
// Hugging Face cache's are): an empty name, a NUL byte, an absolute path or a ".." component is
// InvalidArgument naming the tensor and the name. Returns NotFound naming the file when a shard
// the index names is missing, when the index is there but is no readable file (a dangling link:
// the shards beside it may be only some of them), or saying what was looked for when `dir` holds
// no safetensors; InvalidArgument for an index that is not JSON (a non-string file name, a
// tensor named twice) or names no files.
absl::StatusOr<HfModel> LoadHfModelDir(const std::string& dir);

// Sets a float16 or float32 model's dtype to bf16, the type kiln's runner holds such a
// checkpoint's weights in (it rounds them as it loads them), and returns the dtype it had; any
// other dtype is left as it is (nullopt). Host-only; thread-compatible.
std::optional<config::DType> RunInBf16(config::ModelShape* model);

}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_HF_MODEL_H_
