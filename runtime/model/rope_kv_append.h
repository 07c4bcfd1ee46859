// RoPE and the paged-KV append in one kernel, for the decoder step: reads each token's fused QKV
// row, rotates q in place (Llama's rotate-half form, as LaunchRope), and writes the rotated k and
// the v of the token into its slot of the paged KV cache (as attention's AppendKv with a plan).
//
//   kiln::RopeKvAppendParams p;
//   p.qkv = qkv;                  // [num_tokens, (heads + 2 kv_heads) * head_dim], bf16
//   p.positions = positions;      // int32 [num_tokens]: RoPE positions
//   p.num_tokens = n;  p.heads = 32;  p.kv_heads = 8;  p.head_dim = 64;  p.theta = 500000.0;
//   p.plan = decode_part;         // the step's uploaded plan part (seq_q_start, seq_kv_len)
//   p.kv = {k_cache, v_cache, block_table, max_blocks_per_seq, block_size};
//   CUDA_RETURN_IF_ERROR(kiln::LaunchRopeKvAppend(p, stream));
//
// The results are bit for bit those of LaunchRope followed by AppendKv with the same plan: the
// same cos/sin (double precision per token, rounded to float), the same float rotation and bf16
// rounding, the same token → slot mapping (token j of sequence s goes to position kv_len − q_len
// + j; rows past the plan's tokens, and positions below zero, are not appended). The rotated k
// is not written back to qkv (nothing reads it there).
//
// One CTA per token row; the launch shape depends only on num_tokens and the head counts, so a
// captured graph replays for any later plan and positions. It is launched with programmatic
// dependent launch (internal/pdl_launch.cuh): positions, the plan arrays and the block table are
// read before waiting for the kernel before it, so they must not be written by the kernels of
// the step (the runner uploads them with one copy before the step). Callable during capture;
// thread-safe.
#ifndef KILN_RUNTIME_MODEL_ROPE_KV_APPEND_H_
#define KILN_RUNTIME_MODEL_ROPE_KV_APPEND_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace kiln {

struct RopeKvAppendParams {
  __nv_bfloat16* qkv = nullptr;        // [num_tokens, (heads + 2 kv_heads) * head_dim]
  const int32_t* positions = nullptr;  // [num_tokens]
  int num_tokens = 0;                  // rows of qkv (the grid)
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;                    // a multiple of 16, at most 256
  double theta = 0.0;                  // RoPE base, > 0
  RopeScaling rope_scaling;            // the model's frequency scaling; none by default
  AttentionPlanPartDevice plan;        // seq_q_start [max_seqs + 1], seq_kv_len, max_seqs
  // k_cache and v_cache [blocks, kv_heads, block_size, head_dim]
  PagedKvDevice kv;
};

// Returns whether LaunchRopeKvAppend takes `params`: positive sizes, head_dim a multiple of 16 up
// to 256, a qkv row of at most 2^31 - 1 elements, theta > 0, a valid rope_scaling, a 16-byte
// aligned qkv, block_size a power of two, max_blocks_per_seq at least 1, the plan arrays, the
// block table and both cache pools set, the pools 16-byte aligned.
bool RopeKvAppendSupports(const RopeKvAppendParams& params);

// Enqueues the kernel on `stream`. Returns cudaErrorInvalidValue when RopeKvAppendSupports is
// false, else the launch's error.
cudaError_t LaunchRopeKvAppend(const RopeKvAppendParams& params, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_ROPE_KV_APPEND_H_
