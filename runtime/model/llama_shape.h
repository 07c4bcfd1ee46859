// The shape of a Llama-family decoder: sizes that fix every weight and activation, plus the
// scalars the kernels need (RoPE theta and frequency scaling, RMSNorm epsilon).
//
//   kiln::LlamaShape shape = kiln::LlamaShape::Llama1B();   // hidden 2048, 16 layers, ...
//   RETURN_IF_ERROR(shape.Validate());
//   int64_t qkv_rows = shape.qkv_rows();                      // (32 + 2 * 8) * 64
//
// A plain value type; thread-safe to read; no CUDA.
#ifndef KILN_RUNTIME_MODEL_LLAMA_SHAPE_H_
#define KILN_RUNTIME_MODEL_LLAMA_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "attention/rope_frequency.h"

namespace kiln {

struct LlamaShape {
  int hidden = 2048;          // model width
  int layers = 16;            // decoder layers
  int heads = 32;             // query heads
  int kv_heads = 8;           // key/value heads (GQA); divides heads
  int head_dim = 64;          // per-head width
  int ffn = 8192;             // MLP intermediate width
  int vocab = 128256;         // vocabulary size
  double rope_theta = 500000.0;
  RopeScaling rope_scaling;   // none by default; Llama1B() carries Llama 3.2's
  double rms_eps = 1e-5;
  bool tie_embeddings = true;  // the LM head reuses the embedding table
  bool qkv_bias = false;       // the QKV projection adds a bias (Qwen2's attention_bias)
  bool qk_norm = false;        // q and k heads RMS-normed before RoPE (Qwen3's q_norm, k_norm)

  // Returns the 1B-class shape that kiln's peer figures use: Llama 3.2 1B's sizes and RoPE
  // (theta 500000, llama3 scaling x32, low 1, high 4, original 8192), so its checkpoint loads.
  static LlamaShape Llama1B();

  // Returns a tiny two-layer shape for tests against the CPU reference: hidden 256, 4/2 heads
  // of 64, ffn 512, vocab 1024, untied LM head (so both LM-head paths are exercised).
  static LlamaShape Tiny();

  // Returns OK, or InvalidArgument naming the first field that is out of range or
  // inconsistent (e.g. heads not a multiple of kv_heads) and how to fix it. Sizes are bounded
  // far above any real model (hidden and ffn 2^20, heads, kv_heads and layers 4096, vocab 2^24,
  // head_dim 256), so every dimension and count derived from a valid shape fits its type.
  // rms_eps must be at least the least normal float (about 1.2e-38): the kernels add it in float,
  // where a smaller value is 0 or subnormal (flushed to 0) and an all-zero row divides by zero.
  absl::Status Validate() const;

  // The sizes below are exact for a shape Validate accepts. For any other (negative or huge
  // fields) they are still computed without overflow: a result beyond int64 saturates at its
  // limit, so they are safe to call, e.g. for a message, before Validate.

  // Rows of the fused QKV projection: (heads + 2 * kv_heads) * head_dim.
  int64_t qkv_rows() const;
  // Width of the attention output (the O projection's input): heads * head_dim.
  int64_t q_width() const { return int64_t{heads} * head_dim; }
  // Width of one token's K (or V): kv_heads * head_dim.
  int64_t kv_width() const { return int64_t{kv_heads} * head_dim; }
  // Number of weight parameters (embedding, layers, final norm, LM head unless tied).
  int64_t ParameterCount() const;

  // Returns a one-line description, e.g. "hidden 2048, 16 layers, 32/8 heads x 64, ...".
  std::string ToString() const;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_LLAMA_SHAPE_H_
