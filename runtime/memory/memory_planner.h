// Sizes the KV cache before any graph memory exists: everything else a serving process needs on
// one GPU is reserved first, and what is left of the budget becomes whole KV blocks.
//
//   kiln::config::PlannerConfig config = kiln::DefaultPlannerConfig();   // runtime/config
//   config.set_max_num_seqs(128);
//   ASSIGN_OR_RETURN(kiln::MemoryPlan plan, kiln::PlanMemory(config));
//   for (const kiln::MemoryTerm& t : plan.terms) printf("%-20s %s\n", t.name.c_str(), ...);
//   int64_t blocks = plan.num_kv_blocks;                  // allocate exactly this many
//   int64_t seqs = plan.MaxConcurrency(8192);             // sequences of 8K tokens that fit
//
// The budget, per GPU (every byte figure is per tensor-parallel rank):
//   budget = floor(total × gpu_memory_utilization)
//          − weights − activation arena − attention workspace − graph pool − graph executables
//          − custom all-reduce − NCCL − cuBLASLt workspace − logits − margin
//   KV blocks = floor(rest / block bytes), block bytes = 2 × layers × kv_heads_per_rank ×
//               head_dim × dtype bytes × block_size
// The planner counts what the Runner (runtime/runner) allocates: the same step keys (decode
// sizes, prefill token budgets, the eager key), the model's activation layout for the arena and
// for each captured key (the pool is the largest), the attention planner's own layout
// (//attention:split_kv_planner) for the split-kv workspace and plan, and every graph it
// captures (full: one per captured key; piecewise: layers + 1 per key). A Runner must be given
// the config's graph execution, capture_prefill, prefill_sizes and max_model_len in its
// RunnerOptions (their defaults agree). What only a GPU can tell
// (device memory per graph and per graph node, library buffers, the margin) are estimates with
// their sources in memory_planner.cc; a Calibration in the config replaces them (the memory
// planner's --measure mode measures them).
//
// Host-only (no CUDA); every function is thread-safe and may be called at any time.
#ifndef KILN_RUNTIME_MEMORY_MEMORY_PLANNER_H_
#define KILN_RUNTIME_MEMORY_MEMORY_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/capture_context.h"
#include "runtime/config/dtype.pb.h"
#include "runtime/config/model_shape.pb.h"
#include "runtime/config/planner_config.pb.h"

namespace kiln {

// One line of the budget: a named amount of device memory and where the number comes from.
struct MemoryTerm {
  std::string name;         // e.g. "weights"; stable, for programs
  int64_t bytes = 0;        // per GPU
  std::string explanation;  // one line, for people
};

// The estimates in use for what only a GPU can tell (the Calibration's values where given).
struct PlannerEstimates {
  // The Calibration's flat activation rate per token (arena and pool), or 0: the planner counts
  // the model's activation layout exactly (ActivationArenaBytes).
  int64_t activation_bytes_per_token = 0;
  int64_t graph_bytes_per_graph = 0;       // device memory of one instantiated graph
  int64_t graph_bytes_per_node = 0;        // device memory of one node of an instantiated graph
  int64_t cublaslt_workspace_bytes = 0;
  int64_t custom_allreduce_buffer_bytes = 0;
  int64_t nccl_bytes = 0;
  int64_t margin_bytes = 0;
};

// One step shape the Runner builds (runtime/runner/step_plan.h, StepKeys): a decode key of
// `size` sequences, a prefill key of `size` tokens, or the eager key that takes any batch
// within the limits, and what the planner counts for it.
struct PlannedStepKey {
  CaptureKey key;               // {kDecode, sequences}, {kPrefill, tokens}, {kMixed, max tokens}
  int max_tokens = 0;           // token rows
  int max_rows = 0;             // sequences (logits rows)
  bool captured = false;        // gets a graph (full) or layers + 1 graphs (piecewise)
  int64_t activation_bytes = 0; // the model's activations at these sizes
  int64_t metadata_bytes = 0;   // the step metadata blob: tokens, positions, rows, plan, blocks
  // Split-kv partial outputs and log-sum-exps (float) of the decode and prefill plan parts, and
  // their slots; 0 for a part the key lacks or that never splits.
  int64_t decode_partial_bytes = 0;
  int64_t prefill_partial_bytes = 0;
  int decode_slots = 0;
  int prefill_slots = 0;
  int attention_kernels_per_layer = 0;  // attention kernels and split-kv merges
};

// A budget split into terms, and the KV cache that fits.
struct MemoryPlan {
  config::PlannerConfig config;  // resolved (see ResolvePlannerConfig)
  PlannerEstimates estimates;    // what the terms were computed with
  int64_t total_bytes = 0;       // the GPU's memory
  int64_t budget_bytes = 0;      // floor(total × gpu_memory_utilization)
  // Reserved terms in a fixed order, then "kv_cache" and "unused" (less than one block); the
  // terms sum to budget_bytes exactly. A term that does not apply (NCCL without tensor
  // parallelism) is present with 0 bytes and says why.
  std::vector<MemoryTerm> terms;
  int64_t reserved_bytes = 0;  // the terms before "kv_cache"
  int64_t kv_bytes_per_token = 0;
  int64_t kv_block_bytes = 0;
  int64_t num_kv_blocks = 0;  // at least 1 (PlanMemory fails otherwise)
  int block_size = 0;         // tokens per block
  // Every step key, decode sizes ascending, then prefill budgets, then the eager key.
  std::vector<PlannedStepKey> step_keys;
  int64_t num_graphs = 0;       // graphs captured (piecewise: keys × (layers + 1))
  int64_t num_graph_nodes = 0;  // kernel and memset nodes over all of them

  // Returns the number of tokens the KV cache holds.
  int64_t KvTokens() const { return num_kv_blocks * block_size; }

  // Returns how many sequences of `context_tokens` tokens each (ceil(context / block_size)
  // blocks apiece) the cache holds at once; not capped at max_num_seqs. 0 if context_tokens < 1.
  int64_t MaxConcurrency(int64_t context_tokens) const;

  // Returns the term called `name`, or nullptr. The pointer lives as long as the plan.
  const MemoryTerm* Find(absl::string_view name) const;
};

// Returns `config` with presets expanded (explicit model and GPU fields override the preset),
// every unset field given its default (runtime/config/presets.h), kv_cache_dtype set, and the
// graph config spelled out: graph.capture_sizes the list of the mode (decode sizes, or token
// budgets for GRAPH_MODE_PREFILL_ONLY) with graph.max_capture_size its limit, and in
// GRAPH_MODE_DECODE graph.capture_prefill and graph.prefill_sizes (the prefill step keys); the
// execution FULL unless PIECEWISE. GRAPH_MODE_NONE clears every graph field. Returns
// InvalidArgument naming the first bad or missing value and the fix: utilization outside
// (0, 1] (or NaN), a non-positive dimension or one above kiln's bounds (far above any real model
// or GPU), heads that do not divide, a tensor-parallel size that does not divide them, more than
// 64 query heads per KV head on a rank, a bad capture size, an unknown dtype or preset, or
// gpu_preset "auto" (only the CLI can query the device). Idempotent: resolving a resolved config
// returns it unchanged.
absl::StatusOr<config::PlannerConfig> ResolvePlannerConfig(const config::PlannerConfig& config);

// Returns the estimates for a resolved config: the documented defaults, replaced by the
// config's calibration where it sets a value (clamped to INT64_MAX for an unresolved one).
PlannerEstimates EstimatesFor(const config::PlannerConfig& resolved);

// Returns the step keys the Runner builds for `config` (resolved first, so any config may be
// passed and gets ResolvePlannerConfig's errors), each with its activation bytes, metadata bytes
// and attention kernels (the attention planner's layout at the Runner's options: decode tiles of
// one token's query-head group, prefill tiles of 64 rows, max_model_len as the longest KV).
// InvalidArgument when the attention planner rejects the shape.
absl::StatusOr<std::vector<PlannedStepKey>> PlanStepKeys(const config::PlannerConfig& config);

// Resolves `config` and splits its budget. Returns what ResolvePlannerConfig and PlanStepKeys
// return on bad input, and ResourceExhausted (with the shortfall, the largest term and what to
// change) when the budget leaves less than one KV block.
absl::StatusOr<MemoryPlan> PlanMemory(const config::PlannerConfig& config);

// The formulas, for a resolved model shape and tensor-parallel size `tp`, as kiln's runner shards
// a model (runtime/model/tensor_parallel.h): query heads and MLP width split over ranks, KV heads
// split (or one replicated per rank when fewer than ranks); the embedding and LM head are
// replicated, so every rank computes whole logits and no logits gather is needed. Each that
// takes a shape returns -1 for a shape or `tp` outside ResolvePlannerConfig's bounds (a
// dimension below 1 or above its bound, tp outside [1, 4096]), where its products could
// overflow; inside them none can.

// Returns the size of one element: 2 for BF16 and FP16, 4 for FP32, 1 for FP8; 0 if unspecified.
int64_t DTypeBytes(config::DType dtype);

// Returns the KV heads one rank holds: num_kv_heads / tp, or 1 when tp > num_kv_heads.
int KvHeadsPerRank(const config::ModelShape& model, int tp);

// Returns the parameters one rank holds: embedding (every vocab row), per layer QKV (+ bias),
// O, gate-up, down and two norms, the final norm, and the lm head unless tied.
int64_t WeightParamsPerRank(const config::ModelShape& model, int tp);

// Returns the bytes of one token of KV cache on one rank:
// 2 (K and V) × layers × KvHeadsPerRank × head_dim × DTypeBytes(kv_dtype).
int64_t KvBytesPerToken(const config::ModelShape& model, config::DType kv_dtype, int tp);

// Returns the activation bytes per token row on one rank, before alignment and without the
// last-token rows: three hidden-wide buffers (residual; the O and down projections' output;
// the normed input), QKV, attention output, gate-up and SiLU·mul, in the activation dtype (bf16
// for fp8 weights).
int64_t ActivationBytesPerToken(const config::ModelShape& model, int tp);

// Returns the bytes of the model's activation region for a step of `num_tokens` token rows and
// `num_rows` sequences (logits rows; -1 for either negative or above max_num_batched_tokens' and
// max_num_seqs' bounds) on one rank: the sections of LlamaModel::ActivationBytes
// (runtime/model/llama_model.cc, Offsets), each 256-byte aligned, ending with num_rows
// hidden-wide last-token rows and min(num_tokens, 8) hidden-wide rows of the residual between
// the QKV and gate-up GEMMs (where they fold the norms).
int64_t ActivationArenaBytes(const config::ModelShape& model, int tp, int64_t num_tokens,
                             int64_t num_rows);

// Returns the kernel nodes of one captured step outside attention: per layer 9 kernels (plus 2
// all-reduces with tensor parallelism), and 6 outside the layers.
// A full graph adds num_layers × PlannedStepKey::attention_kernels_per_layer.
int64_t GraphNodesOutsideAttention(const config::ModelShape& model, int tp);

// Returns `n` in decimal with commas between groups of three digits: "128,256", "-1,000", "7".
std::string Thousands(int64_t n);

// Returns `bytes` for people: "14.96 GiB", "128.0 KiB", "32.0 MiB", "512 B".
std::string FormatBytes(int64_t bytes);

// Returns "bf16", "fp16", "fp32", "fp8" or "unspecified".
std::string DTypeName(config::DType dtype);

}  // namespace kiln

#endif  // KILN_RUNTIME_MEMORY_MEMORY_PLANNER_H_
