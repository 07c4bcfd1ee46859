// Paged split-kv decode attention: each query token (usually one per sequence) attends to its
// sequence's paged KV through the block table; the G query heads that share a KV head are packed
// into the rows of one tensor-core tile so every K and V element is read once per KV head.
//
//   kiln::DecodeAttentionParams p;
//   p.dtype = kiln::AttentionDtype::kBf16;
//   p.num_q_heads = 32; p.num_kv_heads = 8; p.head_dim = 128;
//   p.q = q; p.o = o;                 // [tokens, num_q_heads, head_dim]
//   p.kv = cache.device();            // PagedKvCache
//   p.plan = buffers.decode();        // PlanBuffers, after planner.Plan(...) and Upload(stream)
//   RETURN_IF_ERROR(kiln::RunDecodeAttention(p, stream));   // kernel, then merge if split
//
// Supported: bf16 and fp16 (float accumulation), head_dim 64 and 128, 1 to 8 query
// heads per KV head, block sizes that are powers of two >= 16, work items of at most 16 packed
// rows (plan the part with tile_rows between G and 16; with tile_rows 16 it also serves short
// multi-token queries, causally masked). The grid is work_capacity × num_kv_heads from the plan
// layout, so a launch captured in a graph replays correctly with any later plan of that layout;
// padding items (seq = -1) exit at once. On sm_90+ the kernel is launched with programmatic
// dependent launch: it reads its work item, lets the next kernel launch, loads the tokens of its
// first KV steps below kv_len - q_len, then waits for the kernels before it. So the plan
// buffers and the block table must be uploaded before the step, by a copy, and a kernel right
// before this one may write only the step's new tokens [kv_len - q_len, kv_len) of the cache (as
// an append does), not older ones. With rope_append the kernel does that append itself, and
// rotates q; the positions must come from the step's upload too. Legal during capture;
// thread-safe.
#ifndef KILN_ATTENTION_DECODE_KERNEL_H_
#define KILN_ATTENTION_DECODE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace kiln {

struct DecodeAttentionParams {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;         // 64 or 128
  float sm_scale = 0.f;     // softmax scale; 0 means 1 / sqrt(head_dim)
  const void* q = nullptr;  // [tokens, num_q_heads, head_dim]
  int64_t q_stride = 0;     // elements between tokens of q; 0 means num_q_heads × head_dim
  void* o = nullptr;        // [tokens, num_q_heads, head_dim]
  int64_t o_stride = 0;     // elements between tokens of o; 0 means num_q_heads × head_dim
  PagedKvDevice kv;         // the paged cache (holding this step's K and V unless rope_append)
  AttentionPlanPartDevice plan;  // the decode part of an uploaded plan
  // Optional: the step's RoPE and KV append done by the kernel (attention_params.h); then q is
  // unrotated and every sequence of the plan part must have q_len 1.
  DecodeRopeAppendDevice rope_append;
};

// Returns OK when decode attention is built for `num_q_heads` query heads over `num_kv_heads` KV
// heads of width `head_dim` (head_dim 64 or 128; 1 to 8 query heads per KV head),
// else InvalidArgument naming the unsupported value and what is built. Host-only: a model can be
// refused before anything is allocated.
absl::Status DecodeAttentionSupportsShape(int num_q_heads, int num_kv_heads, int head_dim);

// Checks the host-side fields of `params` (dtype, DecodeAttentionSupportsShape, block size,
// tile rows, non-null and 16-byte aligned tensors, strides, the partial workspace of a part
// that splits, the RoPE + KV append and QK norm) and returns InvalidArgument naming the bad
// value, or OK. Device contents (items, lengths, block table) are the planner's responsibility
// and are not read. Thread-safe; callable during capture.
absl::Status ValidateDecodeAttentionParams(const DecodeAttentionParams& params);

// Launches the decode kernel: unsplit tiles are written to o, split ones to the partial
// workspace. With plan.merge_counters set (PlanBuffers sets it), the last chunk of each split
// tile to finish merges the tile into o inside the same launch (one kernel per step, no merge
// launch); this relies on the planner's chunking (chunk k of a tile covers [k·c, (k+1)·c) with
// c the header's kv_chunk_size, in slot first_slot + k). Without counters, LaunchAttentionMerge
// finishes split tiles. Does nothing when plan.work_capacity is 0. InvalidArgument names an
// unsupported or missing parameter (ValidateDecodeAttentionParams); a launch failure comes back
// as a Status.
absl::Status LaunchDecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream);

// Launches the decode kernel and, when the plan part has merge items but no merge counters, the
// merge. Both launches are checked (ValidateDecodeAttentionParams, ValidateAttentionMergeParams)
// before the first is enqueued.
absl::Status RunDecodeAttention(const DecodeAttentionParams& params, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_ATTENTION_DECODE_KERNEL_H_
