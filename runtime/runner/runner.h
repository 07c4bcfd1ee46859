// The Runner composes kiln's components into what a user runs: it sizes device memory with the
// memory planner, builds a Llama-family model over a paged KV cache, captures CUDA graphs for
// every decode size and prefill token budget (largest first, into one shared graph memory pool),
// and serves steps of decode-only, prefill-only and mixed batches: pad → plan attention into a
// pinned blob → replay (or run eagerly when no graph fits), the step's first kernel fetching the
// blob and its last writing the sampled tokens into pinned memory → tokens.
//
//   kiln::RunnerOptions options;
//   options.config.set_model_preset("llama-3.2-1b");   // runtime/config PlannerConfig
//   options.config.set_max_num_seqs(256);
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::Runner> runner, kiln::Runner::Create(options));
//   ASSIGN_OR_RETURN(kiln::RunnerCaptureSummary captured, runner->Capture());
//   std::vector<kiln::SequenceTokens> batch = {{/*id=*/1, {128000, 791, 6460}},   // a prompt
//                                              {/*id=*/2, {13}}};                  // a decode
//   ASSIGN_OR_RETURN(std::vector<int32_t> next, runner->Step(batch));   // one token each
//   RETURN_IF_ERROR(runner->Release(1));                                   // sequence done
//
// Graph modes (RunnerOptions::graphs):
//   kFull       one graph per step key: the whole step, attention included.
//   kPiecewise  per step key, layers + 1 graphs (the pieces between attentions, see
//               runtime/model/llama_model.h); attention runs eagerly between their replays.
//   kNone       every step eager.
// A batch that no key holds (above every captured size) runs eagerly at its exact sizes, with
// the same kernels, and is correct. A graph and an eager run of the same key compute the same
// bits (StepOptions::force_eager runs a key eagerly, for tests and benchmarks), so a key without
// a graph runs eagerly with the bits its graph would give. Capture() captures largest first,
// decode sizes then prefill budgets (in kPiecewise piece by piece, each piece every key before
// the next piece); when it fails, the keys captured before the failure keep their graphs and the
// others run eagerly. In kPiecewise a key replays only when every piece has its graph: a failure
// before the last piece leaves every step eager.
//
// Memory: Create resolves the PlannerConfig (the GPU's name, memory and SM count come from the
// device unless given), plans with runtime/memory's PlanMemory, and allocates what the plan
// names: weights, the eager activation arena, the graph memory pool (sized for the largest key
// that is captured), logits, and exactly the plan's KV blocks (or RunnerOptions::max_kv_blocks
// when smaller). memory() reports each allocation's measured device-memory cost.
//
// Weights: Hugging Face safetensors files (RunnerOptions::weight_files), read and checked against
// the config's model before any device memory is allocated, or seeded random values of that
// shape (weight_seed). The same weights either way give the same bits.
//
// Tensor parallelism (RunnerOptions::bootstrap of world size > 1; one process per GPU of this
// host): each rank holds its shard of the weights (runtime/model/tensor_parallel.h: query and KV
// heads and MLP columns split, embedding, norms and LM head replicated) and its share of the KV
// cache, and all-reduces after the O and down projections through an AutoCommunicator (custom
// one-shot/two-shot or NCCL per call, collectives/auto_communicator.h). Every rank computes the
// same logits and tokens, bit for bit. Create, Capture, RegisterGraphBuffers, Step and Release
// are collective: every rank makes the same calls with the same arguments.
//   Capture runs in lock-step: a barrier before each size, then the ranks exchange how the
//   capture went, so a capture that fails on one rank fails on every rank with the same Status
//   ("Capture of decode/8 failed on rank 1 of 2: ..."), never a hang. It ends with
//   RegisterGraphBuffers() (unless RunnerOptions::register_graph_buffers is false). A failed
//   Capture does not register: every rank keeps the keys captured before the failing one and
//   drops the failing key (also where its own capture of it succeeded), so every rank holds the
//   same graphs; a step that would replay one of them is FailedPrecondition until
//   RegisterGraphBuffers(), and the failing key and those after it run eagerly on every rank.
//   That holds when the ranks still make the same exchanges inside the failed capture. A rank
//   whose capture fails before a captured all-reduce that records a registered input (two-shot,
//   or one-shot with AllReduceConfig.graph_one_shot_registered; the fused all-reduce + add +
//   RMSNorm records none) leaves the others in that
//   all-reduce's agreement while it reports its failure: every rank then fails at once with
//   Internal naming both calls ("custom_allreduce.capture_agreement" against
//   "runner.capture_agreement.full.decode/8"), the bootstrap and the custom all-reduce stay
//   unusable, and the runner must be created again on every rank.
//   Graph states: none ──Capture──► captured ──RegisterGraphBuffers──► registered
//   A step that would replay a graph before registration is FailedPrecondition. A peer that died
//   or hangs ends the next step in DeadlineExceeded within AllReduceConfig.barrier_timeout_ms
//   (the custom all-reduce's barriers give up; NCCL is aborted when the step's stream has not
//   finished by then, Communicator::SynchronizeStream); the runner is unusable afterwards.
//
// Step states: a sequence id first seen in Step starts empty; each Step adds its tokens; Release
// frees its KV blocks. Step synchronises the stream before returning the tokens.
// Not thread-safe: one thread drives a Runner. Nothing here may be called during a capture.
#ifndef KILN_RUNTIME_RUNNER_RUNNER_H_
#define KILN_RUNTIME_RUNNER_RUNNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attention/split_kv_planner.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/auto_communicator.h"
#include "collectives/host_bootstrap.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "graph/graph_memory_pool.h"
#include "graph/graph_set.h"
#include "graph/static_buffers.h"
#include "runtime/config/planner_config.pb.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/stream.h"
#include "runtime/memory/memory_planner.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/llama_weights.h"
#include "runtime/runner/sequence_table.h"
#include "runtime/runner/step_plan.h"

namespace kiln {

// How steps use CUDA graphs.
enum class GraphExecution {
  kFull,       // one graph per key
  kPiecewise,  // layers + 1 graphs per key, attention eager between them
  kNone,       // no graphs
};

// Returns "full", "piecewise" or "none".
const char* GraphExecutionName(GraphExecution mode);

struct RunnerOptions {
  // Model (a preset or explicit fields), GPU (filled from device 0 when absent), limits
  // (max_num_seqs, max_num_batched_tokens), graph mode and decode sizes, block size, utilisation.
  // GRAPH_MODE_DECODE captures the decode sizes and, with capture_prefill, the prefill token
  // budgets; GRAPH_MODE_PREFILL_ONLY captures only its token budgets; GRAPH_MODE_NONE nothing.
  config::PlannerConfig config;
  GraphExecution graphs = GraphExecution::kFull;
  // Longest sequence (prompt plus generated tokens); sets the block-table width.
  int max_model_len = 4096;
  // The model's weights as Hugging Face safetensors files (the names and layout of
  // runtime/model/llama_checkpoint.h: every tensor BF16, or F16 or F32 rounded to bf16 as it
  // loads (the config's model.dtype stays bf16), of exactly the shape the config's model
  // implies). A missing, misnamed or misshapen tensor is InvalidArgument and a truncated file
  // DataLoss, each naming the tensor or file, before any device memory is allocated. Empty:
  // seeded random weights (weight_seed). The weights stream from the files to the GPU through two
  // 32 MiB pinned buffers per reading thread (LlamaDeviceWeights::Load, weight_load_threads), so
  // loading holds no host copy of the model; with tensor parallelism each rank reads only its
  // shard (1 / world of the projections, the replicated tensors whole). kiln's
  // RoPE is the rotate-half form with rope_theta and the model's rope_scaling (the "llama3"
  // kind): Llama 3.1 and 3.2 checkpoints give their reference logits when the config carries
  // their rope_scaling, as the presets do; other scaling kinds are refused. Progress goes to
  // progress_stream: a line at each quarter of rank 0's bytes (not with kNone) and one with the
  // size, time and rate (not with kQuiet).
  std::vector<std::string> weight_files;
  // Threads that read weight_files (at least 1), each with two 32 MiB pinned buffers.
  int weight_load_threads = 4;
  // Seed of the random weights (runtime/model/llama_weights.h), without weight_files.
  uint64_t weight_seed = 1;
  // > 0: allocate at most this many KV blocks (tests and benchmarks that need few).
  int64_t max_kv_blocks = 0;
  // In GRAPH_MODE_DECODE, also capture prefill-only token budgets.
  bool capture_prefill = true;
  // Prefill token budgets; empty: CaptureSizes::DefaultPrefillSizes(min(512, max tokens)).
  std::vector<int> prefill_sizes;
  // GEMM paths and fusions of the model (LlamaModelOptions): rows up to which each projection
  // uses the prefetch GEMM, then the TMA GEMM, then the decode GEMM, whether the down projection
  // there reads SiLU(gate)·up itself, RoPE and the KV append as one kernel, the skinny kernel up
  // to skinny_gemm_max_rows elsewhere, and whether the QKV and gate-up prefetch GEMMs do the add +
  // RMSNorm before them (fold_norm_into_gemm; the same bits either way).
  PrefetchGemmRows prefetch_gemm_rows;
  // prefetch_gemm_rows where the model is sharded over ranks (world size > 1). Every projection
  // up to 8 rows: sharded, the TMA GEMM has half the tiles or half the k, and at batch 4 on 2 ×
  // H200 the step took 0.854–0.863 ms with it from 3 rows against 0.823–0.824 with the prefetch
  // GEMM (the same at 1 and 8; runtime/runner/NOTES.md).
  PrefetchGemmRows sharded_prefetch_gemm_rows = {8, 8, 8, 8, 8};
  int prefetch_gemm_ctas_per_sm = 2;
  bool prefetch_gemm_silu = false;
  bool fold_norm_into_gemm = false;
  TmaGemmRows tma_gemm_rows;
  int tma_gemm_ctas_per_sm = 2;
  TmaGemmSplits tma_gemm_max_splits;
  bool tma_qkv_next_after_wait = true;  // LlamaModelOptions::tma_qkv_next_after_wait
  bool prefetch_gate_up_silu = true;  // LlamaModelOptions::prefetch_gate_up_silu
  bool prefetch_row_halves = true;    // LlamaModelOptions::prefetch_row_halves
  bool tma_gate_up_silu = true;       // LlamaModelOptions::tma_gate_up_silu
  // Steps of at most this many token rows run each piece as one decode layer kernel launch
  // (LlamaModelOptions::layer_kernel_rows; the same bits either way).
  int layer_kernel_rows = LlamaModelOptions{}.layer_kernel_rows;
  DecodeGemmRows decode_gemm_rows;
  bool silu_in_down = true;
  bool fuse_rope_append = true;
  // LlamaModelOptions::rope_in_attention_rows and rope_in_attention_min_rows (the same bits
  // either way).
  int rope_in_attention_rows = LlamaModelOptions{}.rope_in_attention_rows;
  int rope_in_attention_min_rows = LlamaModelOptions{}.rope_in_attention_min_rows;
  int skinny_gemm_max_rows = 2;
  // Split decode attention tiles are merged by the decode kernel itself (merge counters), not by
  // a separate merge launch.
  bool fused_attention_merge = true;
  // The shortest KV chunk of a split decode tile (SplitKvPlanner's decode.min_kv_chunk, a
  // multiple of 64). 64: a batch of one sequence of 1024 tokens splits over 16 chunks per KV
  // head, one 64-token step per warp, instead of 4 chunks of four serial steps (16 µs less per
  // step at batch 1 on an H200, runtime/runner/NOTES.md).
  int decode_min_kv_chunk = 64;
  // Resident decode-attention CTAs per SM the split aims to fill (SplitKvPlanner's
  // decode.ctas_per_sm). 2: on an H200 (1B, 1024 tokens) 6, which splits batches of 16 and 32
  // into 3–6 chunks, was slower at every batch from 2 to 32 (runtime/runner/NOTES.md).
  int decode_ctas_per_sm = 2;
  // Per step, by its decode sequences (one row each), the decode split's aim instead of
  // decode_ctas_per_sm (SplitKvPlanner's decode.aim_by_seqs); per capture key, the largest aim
  // of the batches routed to it sizes its grid (DecodeCtasPerSm). max_seqs strictly ascending.
  // On an H200 (1B, 1024 tokens), with the TMA GEMM from 3 rows, 4 CTAs per SM is faster only
  // at exactly 8 sequences (9 µs) and 2 at every batch below (batch 4 0.990–0.996 against
  // 1.018–1.020 ms, batch 3 1.004–1.008 against 1.059–1.063 with 4); 1 from 9 to 24 (batch 16
  // 1.146–1.163 against 1.171–1.176 ms, 20 1.210–1.213 against 1.233–1.236). 2 for 9–12 makes
  // batches 9–11 8–18 µs faster but 12 and 16 5–14 µs slower (the key of 16 then sizes for 2,
  // and its steps of 13–16 leave half of the grid padding); with 12 added to the capture sizes
  // as well, 9–12 gain 4–16 µs and 13–16 lose nothing (runtime/runner/NOTES.md). Above,
  // decode_ctas_per_sm.
  std::vector<SplitAim> decode_split_by_rows = {{7, 2}, {8, 4}, {24, 1}};
  // decode_split_by_rows for models of head_dim 128 (Llama 3.1 8B and 70B, Qwen2.5 7B), whose
  // tiles read twice the bytes per token. On an H100 (8B, 1024 tokens) 8 sequences are faster
  // aiming at 2 CTAs per SM than at 4 (batch 8 6.137–6.149 against 6.241–6.250 ms; 3 or 1:
  // 6.247–6.268), and every other batch from 1 to 32 is within 15 µs either way
  // (runtime/runner/NOTES.md, "Llama 3.2 3B and 3.1 8B").
  std::vector<SplitAim> decode_split_by_rows_head_dim_128 = {{8, 2}, {24, 1}};
  // Benchmarks only: leave attention out of every step (LlamaModelOptions::run_attention), and
  // the RoPE + KV append where attention does it, to time the rest. The tokens are then not the
  // model's.
  bool skip_attention = false;
  // Benchmarks only, likewise: leave out RoPE with the KV append, the norm kernels or the
  // SiLU·mul kernel (LlamaModelOptions::run_rope_append, run_norms, run_silu_mul).
  bool skip_rope_append = false;
  bool skip_norms = false;
  bool skip_silu_mul = false;
  // Query rows per prefill attention tile: 64 or 128.
  int prefill_tile_rows = 64;
  // Time every step on the device with CUDA events (StepInfo::device_ms), recorded around the
  // step's kernels (from the metadata fetch to the sampled tokens in pinned memory).
  bool time_steps = false;
  // Capture progress (GraphSetOptions), written to progress_stream (std::cerr when null).
  CaptureProgress progress = CaptureProgress::kAuto;
  std::ostream* progress_stream = nullptr;

  // Tensor parallelism: the rendezvous with the other ranks of this model (not owned; must
  // outlive the runner). World size > 1 shards the model over the ranks (see the file comment);
  // config.tensor_parallel_size, when set, must equal the world size. Null: one GPU.
  HostBootstrap* bootstrap = nullptr;
  // The GPU this runner uses; Create makes it current.
  int device = 0;
  // The all-reduce's tuning (enable_custom: false sends every call to NCCL).
  AllReduceConfig allreduce;
  // With tensor parallelism, each all-reduce also does the residual add + RMSNorm after it in
  // one kernel where the communicator supports it (LlamaModelOptions::fuse_allreduce_norm; the
  // same bits either way). false: separate norm kernels, for comparisons.
  bool fuse_allreduce_norm = true;
  // With tensor parallelism, Capture ends with RegisterGraphBuffers(); false leaves that to the
  // caller, and replays are refused until it is called.
  bool register_graph_buffers = true;
  // Benchmarks only: with tensor parallelism, leave the all-reduces out of every step (each rank
  // keeps its partial sums), to time what they cost. The tokens are then not the model's.
  bool skip_allreduce = false;
  // Tests only: runs before each call of a captured step function (warm-ups and the capture,
  // CaptureContext tells which); a non-OK status fails that call on this rank.
  std::function<absl::Status(CaptureKey key)> capture_step_hook_for_testing;
};

// One sequence's part of a step.
struct SequenceTokens {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // new tokens: a prompt or chunk of it, or the last sampled token
};

struct StepOptions {
  // Run the step's key eagerly even when it has a graph (same sizes, same kernels).
  bool force_eager = false;
  // false: the sequences' lengths do not advance (the step can be run again identically).
  bool commit = true;
};

// How the last step ran.
struct StepInfo {
  CaptureKey key;        // the key (kMixed for the eager key)
  bool eager_key = false;  // the batch fitted no captured size
  bool replayed = false;   // a graph (or pieces) ran
  int num_seqs = 0;
  int num_tokens = 0;    // the batch's tokens
  int padded_tokens = 0;  // token rows the step ran at
  int padded_rows = 0;    // logits rows
  float device_ms = 0;    // with RunnerOptions::time_steps: the step's time on the device
};

// What Capture did.
struct RunnerCaptureSummary {
  int num_graphs = 0;
  int num_decode_sizes = 0;
  int num_prefill_sizes = 0;
  double seconds = 0;
  size_t pool_bytes = 0;        // the graph memory pool's high-water mark
  size_t num_nodes = 0;         // nodes over every captured graph
  int64_t device_bytes = 0;     // device memory the captures took (cudaMemGetInfo delta)
  // Returns "Captured 49 graphs (35 decode, 14 prefill sizes) in 0.84 s, pool 28.1 MiB, ...".
  std::string ToString() const;
};

// Device memory, as asked for and as cudaMemGetInfo saw it change.
struct RunnerMemoryItem {
  std::string name;
  int64_t requested_bytes = 0;
  int64_t measured_bytes = 0;  // free-memory drop across the allocation
};

struct RunnerMemory {
  std::vector<RunnerMemoryItem> items;  // weights, kv_cache, activation_arena, graph_pool, ...
  // Returns the item called `name`, or nullptr.
  const RunnerMemoryItem* Find(const std::string& name) const;
};

class Runner {
 public:
  // Plans memory and allocates everything (see the file comment); the random weights are
  // written on the runner's stream. InvalidArgument for an unsupported model (not bf16,
  // attention bias, a head_dim without kernels, heads that do not split over the ranks) or bad
  // limits; ResourceExhausted from the planner or an allocation; for weight_files, the error of
  // reading them (NotFound, InvalidArgument for a tensor that does not fit the model, DataLoss).
  // With tensor parallelism it is collective, creates the communicator, and every rank returns
  // the same error.
  static absl::StatusOr<std::unique_ptr<Runner>> Create(const RunnerOptions& options);

  // Returns options.config with the Runner's own graph choices written in — piecewise
  // execution, whether prefill budgets are captured, their sizes, max_model_len — so the memory
  // planner counts the graphs, pool and block tables this Runner will create. kNone keeps the
  // config's graphs: the planner then reserves for graphs that are never captured, which is
  // safe. Host-only; thread-safe.
  static config::PlannerConfig PlannerConfigFor(const RunnerOptions& options);

  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Captures every key of the graph mode, largest first (decode sizes, then prefill budgets),
  // with a progress bar and a summary line. A no-op in GraphExecution::kNone. Capturing again
  // replaces the graphs. On error, the keys captured before the failure keep their graphs (in
  // kPiecewise a key replays only when every piece has it) and the others run eagerly. With
  // tensor parallelism: in lock-step on every rank, then RegisterGraphBuffers() unless
  // options().register_graph_buffers is false; every rank returns the same error, and after an
  // error nothing replays until RegisterGraphBuffers() (see the file comment).
  absl::StatusOr<RunnerCaptureSummary> Capture();

  // Registers the all-reduce inputs captured into the graphs with every peer, after which the
  // graphs may replay. Collective; a no-op without tensor parallelism.
  absl::Status RegisterGraphBuffers();

  // Runs one step: each entry's tokens are appended to its sequence, and the greedy next token
  // of each sequence is returned in entry order. InvalidArgument for an empty or oversized
  // batch, a duplicate id, an empty token list, a token outside the vocabulary, or a sequence
  // past max_model_len; ResourceExhausted when the KV cache lacks blocks. With tensor
  // parallelism: FailedPrecondition for a step that would replay graphs before
  // RegisterGraphBuffers(), DeadlineExceeded when a peer stopped answering. A refused step
  // (these errors but the last) changes no sequence. A step that fails on the device (a CUDA
  // error, a lost peer) changes no sequence's length, but the blocks it reserved stay with its
  // sequences (a sequence it named first exists with length 0) until Release.
  absl::StatusOr<std::vector<int32_t>> Step(absl::Span<const SequenceTokens> batch,
                                            const StepOptions& step_options = {});

  // Frees sequence `id`'s KV blocks. NotFound for an unknown id.
  absl::Status Release(int64_t id);

  // Copies the last step's float logits of its first `num_seqs` sequences ([num_seqs, vocab]).
  absl::StatusOr<std::vector<float>> LastLogits(int num_seqs);

  // Fills the logits and next-token buffers with 0xFF bytes (NaN, -1), so a test can tell an
  // unwritten output from a written one. Asynchronous on the runner's stream.
  absl::Status PoisonOutputs();

  // Gives sequence `id` `length` more cached tokens without computing them (a new id starts at
  // 0; the KV cache keeps whatever its blocks hold): for benchmarks that need long contexts
  // quickly. InvalidArgument past max_model_len, ResourceExhausted when the KV cache lacks blocks.
  absl::Status SetContextForBenchmark(int64_t id, int length);

  // Returns the shape this rank runs (its heads and MLP columns; the whole model on one GPU).
  const LlamaShape& shape() const { return model_->shape(); }
  // Returns the whole model's shape.
  const LlamaShape& full_shape() const { return full_shape_; }
  // Returns this process's rank and the number of ranks (0 and 1 on one GPU).
  int rank() const { return options_.bootstrap != nullptr ? options_.bootstrap->rank() : 0; }
  int tensor_parallel_size() const {
    return options_.bootstrap != nullptr ? options_.bootstrap->world_size() : 1;
  }
  // Returns the communicator (null on one GPU).
  AutoCommunicator* communicator() const { return comm_.get(); }
  // Returns true once the graphs may replay (registered; always true on one GPU).
  bool graphs_registered() const { return graphs_registered_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  const RunnerMemory& memory() const { return memory_; }
  const StepInfo& last_step() const { return last_; }
  const RunnerOptions& options() const { return options_; }
  const StepKeys& keys() const { return keys_; }
  const std::optional<CaptureSizes>& decode_sizes() const { return decode_sizes_; }
  const std::optional<CaptureSizes>& prefill_sizes() const { return prefill_sizes_; }
  const SequenceTable& sequences() const { return table_; }
  // Returns the graph memory pool (null without graphs in full mode).
  const GraphMemoryPool* pool() const { return pool_ ? &*pool_ : nullptr; }
  cudaStream_t stream() const { return stream_.get(); }
  int num_kv_blocks() const { return model_->kv_layout().num_blocks; }
  LlamaModel& model() { return *model_; }

 private:
  Runner() = default;

  absl::Status Init(const RunnerOptions& options);
  // Init's steps before and after the communicator exists.
  absl::Status InitPlan(const RunnerOptions& options);
  absl::Status InitAllocations(const RunnerOptions& options);
  // InitPlan's check of RunnerOptions::weight_files against full_shape_: opens weight_reader_
  // (this rank's shard).
  absl::Status OpenWeightFiles(const RunnerOptions& options);
  // InitAllocations' streaming of weight_reader_'s shard to the GPU, with progress.
  absl::StatusOr<LlamaDeviceWeights> LoadWeights(const RunnerOptions& options,
                                                 cudaStream_t stream);
  // The model's options from `options`, the plan and the sequence table (InitPlan's), and the
  // communicator where it exists.
  LlamaModelOptions ModelOptions(const RunnerOptions& options) const;
  // `status` prefixed with the option and the model it was read for.
  absl::Status WeightFilesError(const absl::Status& status) const;
  // Captures fn for every size of `sizes` into `set`, largest first: one GPU through
  // GraphSet::CaptureAll; tensor parallel in lock-step (see the file comment), with bootstrap
  // calls named by `scope` (the graph set: "full", or "piece/3" for piece 3) and the key. Returns
  // the number of graphs.
  absl::StatusOr<int> CaptureEachSize(GraphSet& set, absl::string_view scope, GraphMode mode,
                                      const CaptureSizes& sizes, const KeyedStepFn& fn);
  // Returns capture_step_hook_for_testing's verdict for `key` (OK without a hook).
  absl::Status RunCaptureHook(CaptureKey key) const;
  // The device views of key `key_index` at the route's sizes over `activations`.
  LlamaStepArgs Args(int key_index, const StepRoute& route, void* activations) const;
  // Writes an empty step for the key (no sequences) into the pinned metadata blob, so warm-ups
  // before a capture read valid inputs.
  absl::Status FillEmptyStep(int key_index);
  // Launches the step's first kernel, which copies the key's metadata from the pinned blob into
  // the device blob the step reads (step_fetch.h). Part of every captured step.
  absl::Status FetchMetadata(int key_index, cudaStream_t stream) const;
  // Runs the step eagerly (activations in the arena).
  absl::Status RunEager(int key_index, const StepRoute& route);
  // Looks `key` up once in every piece's GraphSet and returns the graphs, one per piece (held in
  // piece_lookup_, valid until the next call or capture), or an empty span when some piece has
  // no graph for it (none was captured, or a capture stopped part-way: the step then runs
  // eagerly); piece_lookup_ then holds no graph either.
  absl::Span<const GraphSet::Graph* const> FindPieceGraphs(CaptureKey key);
  // Replays `graphs`, FindPieceGraphs's for this step's key (one per piece), running each layer's
  // attention eagerly between them with the step's views checked once, before the first.
  absl::Status RunPiecewise(int key_index, const StepRoute& route,
                            absl::Span<const GraphSet::Graph* const> graphs);
  absl::Status CaptureFull(RunnerCaptureSummary* summary);
  absl::Status CapturePiecewise(RunnerCaptureSummary* summary);
  std::vector<std::pair<GraphMode, const CaptureSizes*>> CapturedSizeLists() const;

  RunnerOptions options_;
  LlamaShape full_shape_;
  // This rank's shard of RunnerOptions::weight_files, checked, between InitPlan and the load.
  std::optional<LlamaShardReader> weight_reader_;
  std::unique_ptr<AutoCommunicator> comm_;  // tensor parallel; outlives the model and graphs
  absl::Status peer_lost_;  // a step's collectives timed out: every later step returns this
  bool graphs_registered_ = false;
  MemoryPlan plan_;
  int sm_count_ = 0;
  int max_blocks_per_seq_ = 0;
  Stream stream_;
  std::unique_ptr<LlamaModel> model_;
  SequenceTable table_{0, 1, 0};
  // Step's lists of the batch's entries, lengths, tokens and blocks: cleared at each Step and
  // refilled, kept for their capacity so that a step allocates none of them.
  std::vector<SequenceTable::Entry> step_entries_;
  std::vector<SeqLens> step_lens_;
  std::vector<absl::Span<const int32_t>> step_tokens_, step_blocks_;
  std::optional<CaptureSizes> decode_sizes_;   // padding keys (captured in decode mode)
  std::optional<CaptureSizes> prefill_sizes_;  // padding keys (captured when prefill is on)
  bool capture_decode_ = false;
  bool capture_prefill_ = false;
  StepKeys keys_;
  std::vector<SplitKvPlanner> planners_;   // per key
  std::vector<MetadataLayout> layouts_;    // per key
  PinnedHostBuffer metadata_host_;  // written by the host; each step's first kernel reads it
  DeviceBuffer metadata_device_;
  DeviceBuffer decode_partial_o_, decode_partial_lse_, prefill_partial_o_, prefill_partial_lse_;
  DeviceBuffer decode_merge_counters_, prefill_merge_counters_;  // zero between launches
  DeviceBuffer arena_;
  std::optional<GraphMemoryPool> pool_;
  DeviceBuffer logits_;       // float [max_num_seqs, vocab]
  DeviceBuffer next_tokens_;  // int32 [max_num_seqs]
  PinnedHostBuffer next_tokens_host_;  // the sampling kernel writes the tokens here as well
  StaticBuffers buffers_;
  std::unique_ptr<GraphSet> graphs_;                     // kFull
  std::vector<std::unique_ptr<GraphSet>> piece_graphs_;  // kPiecewise, one per piece
  std::vector<const GraphSet::Graph*> piece_lookup_;     // FindPieceGraphs's storage
  RunnerMemory memory_;
  StepInfo last_;
  Event step_start_, step_stop_;  // with time_steps
};

// Returns the LlamaShape of a resolved config::ModelShape (attention_bias: LlamaShape::qkv_bias;
// qk_norm: LlamaShape::qk_norm).
// InvalidArgument for what kiln's model does not run: a dtype other than bf16, a rope_scaling
// that is not a complete, valid "llama3" one, heads or a head_dim decode attention has no kernel
// for (head_dim 96, or more than 8 query heads per KV head: DecodeAttentionSupportsShape).
absl::StatusOr<LlamaShape> LlamaShapeFromConfig(const config::ModelShape& model);

// Returns InvalidArgument when `model` has a sliding window (Mistral 7B v0.1's attention over its
// last 4096 tokens) shorter than max_model_len: kiln's attention sees every token, which is the
// same only for sequences that fit the window. Runner::Create checks it.
absl::Status CheckSlidingWindow(const config::ModelShape& model, int max_model_len);

// Returns the LlamaShape of `resolved` (a config ResolvePlannerConfig returned) where the Runner
// can build it: LlamaShapeFromConfig's shape, no sliding window shorter than max_model_len
// (CheckSlidingWindow), a bf16 KV cache and max_num_seqs within one greedy-sampling launch
// (kGreedySampleMaxRows). Host-only: Runner::Create checks the same before it
// allocates, so tools can say it before they look for a GPU.
absl::StatusOr<LlamaShape> CheckRunnerModel(const config::PlannerConfig& resolved,
                                            int max_model_len);

// The most resident CTAs per SM a decode split may aim at (RunnerOptions::decode_ctas_per_sm and
// the split rules' ctas_per_sm): what an SM of sm_80 or sm_90 holds.
inline constexpr int kMaxCtasPerSm = 32;

// Returns InvalidArgument, naming the option, its value and the way out, for what Runner::Create
// refuses in `options` without a GPU: max_model_len below 1, graphs or progress outside their
// enums, decode split rules that are not positive and strictly ascending or aim above
// kMaxCtasPerSm, a prefill_tile_rows other than 64 or 128, decode_min_kv_chunk or
// decode_ctas_per_sm below 1 (or the latter above kMaxCtasPerSm), and sharded_prefetch_gemm_rows
// outside [0, kPrefetchGemmMaxRows]. The model's options (GEMM rows, layer_kernel_rows, ...) need
// the plan's shape and KV blocks: CheckLlamaModelOptions. Runner::Create runs it first, before
// it touches the device. Host-only; thread-safe.
absl::Status CheckRunnerOptions(const RunnerOptions& options);

// The decode split rules `options` give a model of `head_dim`:
// decode_split_by_rows_head_dim_128 for head_dim 128, decode_split_by_rows otherwise.
const std::vector<SplitAim>& DecodeSplitRules(const RunnerOptions& options, int head_dim);

// What a Runner builds for its steps on the host: the sizes that pad batches, the step keys over
// them, and per key the attention planner and the metadata layout (indexed like keys.keys()).
struct StepSetup {
  std::optional<CaptureSizes> decode_sizes;   // decode batch sizes (sequences)
  std::optional<CaptureSizes> prefill_sizes;  // prefill token budgets
  StepKeys keys;
  std::vector<SplitKvPlanner> planners;  // per key
  std::vector<MetadataLayout> layouts;   // per key
};

// Builds the StepSetup Runner::Create builds from `resolved` (the config PlanMemory resolved for
// Runner::PlannerConfigFor(options)) and `options` (which should pass CheckRunnerOptions):
//   decode sizes     GRAPH_MODE_DECODE: the config's capture sizes; else the default list, up to
//                    max_num_seqs
//   prefill budgets  GRAPH_MODE_PREFILL_ONLY: the config's capture sizes; else
//                    options.prefill_sizes, or the default list up to min(512,
//                    max_num_batched_tokens)
//   keys             StepKeys::Create over both, then the eager key
//   planners         PlannerOptionsFor(key, ...) for `shape` (this rank's heads) on `sm_count`
//                    SMs, KV up to max_model_len, with options' prefill_tile_rows,
//                    decode_min_kv_chunk and decode split (SetDecodeSplit, DecodeSplitRules)
//   layouts          MetadataLayout::Create(key, the planner's plan_bytes, max_blocks_per_seq)
// Sizes pad batches whether or not they are captured, so eager steps run at the shapes of graphs.
// InvalidArgument naming the value and the fix for max_blocks_per_seq below 1, a capture size or
// budget outside its limit, and what SplitKvPlanner::Create refuses (an sm_count below 1, ...).
// Host-only; thread-safe.
absl::StatusOr<StepSetup> BuildStepSetup(const config::PlannerConfig& resolved,
                                         const RunnerOptions& options, const LlamaShape& shape,
                                         int sm_count, int max_blocks_per_seq);

// What Runner::Create plans on the host for one GPU described by `options.config`'s GPU preset
// (or gpu spec) rather than the device: the config PlanMemory resolved, the model's shape
// (CheckRunnerModel), the GPU's SM count, the block table's width and the StepSetup
// (BuildStepSetup). For measuring and testing a step's host work without a GPU.
struct HostStepPlan {
  config::PlannerConfig resolved;
  LlamaShape shape;
  int sm_count = 0;
  int max_blocks_per_seq = 0;
  StepSetup steps;
};

// Plans `options` as Runner::Create would on one GPU, without one: CheckRunnerOptions,
// PlanMemory(PlannerConfigFor(options)) at tensor_parallel_size 1, CheckRunnerModel and
// BuildStepSetup, returning the first refusal. Host-only; thread-safe.
absl::StatusOr<HostStepPlan> PlanHostSteps(const RunnerOptions& options);

// Returns InvalidArgument, naming the sequence, for a sequence of `batch` that brings more than
// max_num_batched_tokens tokens or a token outside [0, vocab). Runner::Step's first check: the
// token ids it lets through are never negative, so the step's fill does not read them again
// (StepIds::kCheckedByCaller). Host-only; thread-safe.
absl::Status CheckStepTokens(absl::Span<const SequenceTokens> batch, int vocab,
                             int max_num_batched_tokens);

// Returns the config::ModelShape (bf16) of `shape`, named `name`: the inverse of
// LlamaShapeFromConfig, for configs built from a LlamaShape (tests, benchmarks).
config::ModelShape ModelShapeFromLlamaShape(const LlamaShape& shape, absl::string_view name);

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_RUNNER_H_
