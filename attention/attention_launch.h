// One step's attention over the paged KV cache, for decode-only, prefill-only and mixed batches:
// the plan's decode part (q_len-1 sequences) runs the decode kernel, its prefill part (the other
// sequences) runs the prefill kernel (or, for tiles of at most 16 rows, the decode kernel), and
// each part that can split is finished by the shared merge kernel.
//
//   kiln::SplitKvPlannerOptions options = ...;   // decode.tile_rows = G, prefill.tile_rows = 128
//   ASSIGN_OR_RETURN(kiln::SplitKvPlanner planner, kiln::SplitKvPlanner::Create(options));
//   ASSIGN_OR_RETURN(kiln::PlanBuffers buffers, kiln::PlanBuffers::Create(planner.layout()));
//   kiln::AttentionStepParams step;
//   step.dtype = kiln::AttentionDtype::kBf16;
//   step.num_q_heads = 32;  step.num_kv_heads = 8;  step.head_dim = 128;
//   step.q = q;  step.o = o;                 // [tokens, num_q_heads, head_dim]
//   step.kv = cache.device();
//   step.decode = buffers.decode();  step.prefill = buffers.prefill();
//   // every step (eager or before a replay):
//   ASSIGN_OR_RETURN(auto summary, planner.Plan(seqs, buffers.host_plan()));
//   RETURN_IF_ERROR(buffers.Upload(stream));
//   RETURN_IF_ERROR(kiln::RunAttentionStep(step, stream));   // or replay the captured graph
//
// Graph safety: every launch's grid is a capacity of the plan layout (work_capacity or
// merge_capacity × num_kv_heads) and every pointer is a fixed buffer, so the launches depend
// only on the capture key; a graph captured once replays any later plan of the same layout.
#ifndef KILN_ATTENTION_ATTENTION_LAUNCH_H_
#define KILN_ATTENTION_ATTENTION_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"
#include "attention/decode_kernel.h"
#include "attention/merge_kernel.h"
#include "attention/prefill_kernel.h"

namespace kiln {

// Everything one step's attention needs. Plain data; the caller owns every buffer.
struct AttentionStepParams {
  AttentionDtype dtype = AttentionDtype::kBf16;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;          // 64 or 128
  float sm_scale = 0.0f;     // softmax scale; 0 means 1 / sqrt(head_dim)
  const void* q = nullptr;   // [tokens, num_q_heads, head_dim] of the whole step
  int64_t q_stride = 0;      // elements between tokens of q; 0 means num_q_heads × head_dim
  void* o = nullptr;         // [tokens, num_q_heads, head_dim]
  int64_t o_stride = 0;      // elements between tokens of o; 0 means num_q_heads × head_dim
  PagedKvDevice kv;          // the paged cache, holding this step's K and V unless rope_append
  AttentionPlanPartDevice decode;   // PlanBuffers::decode(); all null when the plan has none
  AttentionPlanPartDevice prefill;  // PlanBuffers::prefill(); all null when the plan has none
  // Optional, decode-only steps (no prefill part): the decode kernel does the step's RoPE and KV
  // append itself (attention_params.h); q is then unrotated and kv need not hold the new tokens.
  DecodeRopeAppendDevice rope_append;
};

// Enqueues on `stream`: the decode part's kernel, the prefill part's kernel, then the merge of
// each part that can split (same stream, so the merges see the partials), except a part the
// decode kernel runs with merge counters (it merges those itself). A disabled part
// (work_capacity 0) launches nothing. InvalidArgument names a missing or misaligned pointer or
// an unsupported shape, including a part that may split without a partial workspace; every
// launch is checked before the first is enqueued. Launch errors come back as a Status. Callable
// during capture; thread-safe.
absl::Status RunAttentionStep(const AttentionStepParams& params, cudaStream_t stream);

// Returns the prefill kernel's params for `part` of a step (tile_rows 64 or 128). For callers
// that launch the prefill kernel by itself; thread-safe.
PrefillAttentionParams PrefillParamsForPart(const AttentionStepParams& params,
                                            const AttentionPlanPartDevice& part);

// Returns the decode kernel's params for `part` of a step (tiles of at most 16 rows), with
// `rope_append` (the decode part's; empty for any other). As RunAttentionStep derives them.
DecodeAttentionParams DecodeParamsForPart(const AttentionStepParams& params,
                                          const AttentionPlanPartDevice& part,
                                          const DecodeRopeAppendDevice& rope_append);

// Returns the merge kernel's params for `part` of a step. As RunAttentionStep derives them.
AttentionMergeParams MergeParamsForPart(const AttentionStepParams& params,
                                        const AttentionPlanPartDevice& part);

}  // namespace kiln

#endif  // KILN_ATTENTION_ATTENTION_LAUNCH_H_
