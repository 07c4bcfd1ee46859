// Internal: the attention launchers without their checks, for callers in attention/ that build
// each launch's params once, validate all of them, and only then enqueue (RunAttentionStep,
// RunDecodeAttention). Each public Launch* is its Validate* followed by the unchecked launcher
// here, so one check serves every launch. AppendKvWithValidLayout is AppendKv without the
// layout's check, for owners of a layout validated once (PagedKvCache, LlamaModel).
//
//   ASSIGN_OR_RETURN(kiln::RopeFrequencies freqs,
//                    kiln::attention_internal::ValidateDecodeAttention(decode));
//   RETURN_IF_ERROR(kiln::ValidateAttentionMergeParams(merge));   // every check first ...
//   RETURN_IF_ERROR(kiln::attention_internal::LaunchDecodeAttentionUnchecked(decode, freqs, s));
//   RETURN_IF_ERROR(kiln::attention_internal::LaunchAttentionMergeUnchecked(merge, s));
//
// The params structs are declared here, not included: their public headers belong to the
// libraries that define these launchers, which include this header.
#ifndef KILN_ATTENTION_INTERNAL_UNCHECKED_LAUNCH_H_
#define KILN_ATTENTION_INTERNAL_UNCHECKED_LAUNCH_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/rope_frequency.h"

namespace kiln {

struct AppendKvParams;          // attention/paged_kv_cache.h
struct AttentionMergeParams;    // attention/merge_kernel.h
struct DecodeAttentionParams;   // attention/decode_kernel.h
struct PagedKvDevice;           // attention/attention_params.h
struct PagedKvLayout;           // attention/paged_kv_layout.h
struct PrefillAttentionParams;  // attention/prefill_kernel.h

namespace attention_internal {

// Returns what ValidateDecodeAttentionParams(params) returns when it refuses; otherwise the
// RoPE frequencies of params.rope_append, derived once by the check of its scaling
// (RopeFrequencies() without positions). Thread-safe; callable during capture.
absl::StatusOr<RopeFrequencies> ValidateDecodeAttention(const DecodeAttentionParams& params);

// Enqueues the decode kernel for `params` that ValidateDecodeAttention accepted, with the
// frequencies it returned; nothing when plan.work_capacity <= 0. Only a launch error can come
// back. Callable during capture; thread-safe.
absl::Status LaunchDecodeAttentionUnchecked(const DecodeAttentionParams& params,
                                            const RopeFrequencies& rope_freqs,
                                            cudaStream_t stream);

// Enqueues the prefill kernel for `params` that ValidatePrefillAttentionParams accepted;
// nothing when num_work_items is 0. Only a launch error can come back. Callable during
// capture; thread-safe.
absl::Status LaunchPrefillAttentionUnchecked(const PrefillAttentionParams& params,
                                             cudaStream_t stream);

// Enqueues the merge for `params` that ValidateAttentionMergeParams accepted; nothing when
// plan.merge_capacity <= 0. Only a launch error can come back. Callable during capture;
// thread-safe.
absl::Status LaunchAttentionMergeUnchecked(const AttentionMergeParams& params,
                                           cudaStream_t stream);

// Does what AppendKv(params, layout, kv, k_cache, v_cache, stream) does for a `layout` that
// PagedKvLayout::Validate accepted: checks every other argument, which may change per call,
// with AppendKv's messages, then enqueues the append; nothing when params.max_tokens <= 0. The
// layout is not checked again. Owns no pointer. Callable during capture; thread-safe.
absl::Status AppendKvWithValidLayout(const AppendKvParams& params, const PagedKvLayout& layout,
                                     const PagedKvDevice& kv, void* k_cache, void* v_cache,
                                     cudaStream_t stream);

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_UNCHECKED_LAUNCH_H_
