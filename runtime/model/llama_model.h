// One forward step of a Llama-family decoder over a paged KV cache, in bf16 with float
// accumulation: embedding, per layer [RMSNorm (fused with the residual add after the first),
// QKV GEMM, RoPE + KV append (one kernel; in decode-only steps of a few rows done by the
// attention kernel itself), split-kv attention, O GEMM, add + RMSNorm, gate-up
// GEMM, SiLU·mul, down GEMM (the gate-up GEMM writes SiLU(gate)·up itself where the prefetch or
// TMA GEMM takes it; the down GEMM can read it instead; for few rows the norms can run inside
// the QKV and gate-up GEMMs, "Folded norms" below)], final add +
// RMSNorm, the last token of each sequence, float logits, greedy argmax.
//
//   ASSIGN_OR_RETURN(kiln::LlamaDeviceWeights w, kiln::LlamaDeviceWeights::Random(shape, 1, s));
//   kiln::LlamaModelOptions options;
//   options.num_kv_blocks = 4096;
//   options.block_size = 64;
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::LlamaModel> model,
//                    kiln::LlamaModel::Create(std::move(w), options));
//   kiln::LlamaStepArgs args;                        // device views, fixed per capture key
//   args.num_tokens = 8;  args.num_rows = 8;         // padded sizes
//   args.token_ids = ...; args.positions = ...; args.last_token_rows = ...;
//   args.block_table = ...; args.max_blocks_per_seq = ...;
//   args.decode = decode_part;  args.prefill = prefill_part;   // an uploaded attention plan
//   args.activations = arena;  args.logits = logits;  args.next_tokens = next;
//   RETURN_IF_ERROR(model->Prepare(8, 8));            // outside capture
//   RETURN_IF_ERROR(model->Forward(args, stream));    // or capture it into a graph
//
// Graph safety: every launch's shape depends only on num_tokens, num_rows, the model shape and
// the attention plan's layout (which the capture key fixes); everything that changes per step
// (token ids, positions, last-token rows, block table, plan) is read from device memory.
//
// Pieces: Forward is RunPiece(0), RunAttention(0), RunPiece(1), ..., RunAttention(L-1),
// RunPiece(L). Piece 0 is the embedding and layer 0 up to its KV append; piece l (0 < l < L)
// finishes layer l-1 after attention and runs layer l up to its KV append; piece L finishes the
// last layer and produces logits and tokens. With layer_kernel_rows, a step of that many rows
// or fewer runs each piece's layer work as one decode layer kernel launch (decode_layer.h),
// with the same bits. Piecewise CUDA graphs capture the pieces and run
// attention eagerly between them; the kernels and their order are the same as Forward's, so the
// results are identical bit for bit. A caller that runs a step's pieces itself (the Runner
// replays their graphs) checks the step's views once (CheckedLlamaStepArgs::Check) and runs
// each layer's attention with them, unchecked.
//
// Activations: ActivationBytes(num_tokens, num_rows) bytes at args.activations (an arena or the
// graph memory pool), carved as
//   residual, hidden, normed  [num_tokens, hidden] each
//   qkv                       [num_tokens, (heads + 2 kv_heads) * head_dim]
//   attention output          [num_tokens, heads * head_dim]
//   gate_up, act              [num_tokens, 2 ffn], [num_tokens, ffn]
//   last                      [num_rows, hidden]
//   mid_residual              [min(num_tokens, kPrefetchGemmMaxRows), hidden]
// Rows past a step's tokens (padding) are computed on zero embeddings and never read back; the
// attention output is cleared once per step so padding rows hold zeros, not stale values.
//
// GEMMs: per projection, the prefetch GEMM up to options.prefetch_gemm_rows (prefetch_gemm.h: the
// weights bulk-copied into shared memory before the previous kernel ends), else the TMA GEMM up to
// options.tma_gemm_rows (tma_gemm.h: the same idea on wgmma, for tens of rows), else the decode
// GEMM up to options.decode_gemm_rows (decode_gemm.h: tensor cores, split-K, weights streamed from
// before the previous kernel ends), the skinny kernel up to options.skinny_gemm_max_rows, cuBLASLt
// above; every choice depends only on the projection and (m, n, k), so an eager step at a graph's
// padded size computes the same bits as the graph, and Forward makes the choices (with the
// step's other ones: folded norms, fused all-reduce norms, RoPE in attention) once per step,
// RunPiece once per call, not once per layer. Every kiln kernel of the step is launched with
// programmatic dependent launch (internal/pdl_launch.cuh), so each starts while the one before it
// finishes.
//
// Folded norms: where a step's QKV and gate-up projections both run through the prefetch GEMM (at
// most kPrefetchGemmMaxRows rows) and fold_norm_into_gemm is on (and the all-reduce does not
// already do the norms, below), the residual add + RMSNorm before each runs in that GEMM's prologue
// (PrefetchGemmInput::kAddRmsNorm; layer 0's plain RMSNorm as kRmsNorm): the two norm kernels per
// layer drop out, with the same bits (off by default: not faster, see the option). Every CTA of the
// GEMM reads the residual, so the one that adds to it writes the sum elsewhere: the QKV GEMM from
// `residual` into mid_residual, the gate-up GEMM back into `residual`, so every layer (and piece)
// starts with the residual in `residual`, folded or not.
//
// Tensor parallelism: with LlamaModelOptions::communicator set, the weights are one rank's shard
// (runtime/model/tensor_parallel.h: heads and MLP columns split, the rest replicated) and the O
// and down projections' partial sums are all-reduced into `hidden` (see PostAttention). Every
// rank then makes the same calls in the same order. Where the communicator supports it for the
// step's token count (and fuse_allreduce_norm is on), each all-reduce also does the residual add
// and the RMSNorm after it in the same kernel: after O the post-attention norm, after down the
// next layer's input norm (or the final norm), writing the normed rows into `hidden`; the
// separate norm kernels drop out. Same bits as the unfused step.
//
// Not thread-safe (one stream at a time). The model owns the weights, the KV cache and the GEMM
// workspace; graphs captured over it must not outlive it.
#ifndef KILN_RUNTIME_MODEL_LLAMA_MODEL_H_
#define KILN_RUNTIME_MODEL_LLAMA_MODEL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/attention_params.h"
#include "attention/paged_kv_layout.h"
#include "collectives/communicator.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/decode_gemm.h"
#include "runtime/model/decode_layer.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/gemm.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/prefetch_gemm.h"
#include "runtime/model/tma_gemm.h"

namespace kiln {

// Returns the decode layer kernel's view of one layer of `shape` (decode_layer.h).
DecodeLayerShape DecodeLayerShapeOf(const LlamaShape& shape);

// The most rows each projection runs through the decode GEMM (decode_gemm.h); 0: never. A
// projection with more rows, or one the decode GEMM does not take, uses the skinny kernel up to
// skinny_gemm_max_rows and cuBLASLt above. Never by default: on an H200 (1B shape) it had won
// for the down projection up to 4 rows (reading SiLU(gate)·up itself) against cuBLASLt, but the
// TMA GEMM after the SiLU·mul kernel is faster there (batch 3 1.005–1.009 against 1.072–1.081
// ms, runtime/runner/NOTES.md).
struct DecodeGemmRows {
  int qkv = 0;
  int o = 0;
  int gate_up = 0;
  int down = 0;
  int lm_head = 0;
};

// The most rows each projection runs through the prefetch GEMM (prefetch_gemm.h); 0: never; at
// most kPrefetchGemmMaxRows. It comes before the decode GEMM: a projection it takes at m rows
// uses neither the decode GEMM, the skinny kernel nor cuBLASLt. The defaults follow
// runtime/runner/NOTES.md (H200, 1B shape): the four layer projections up to 2 rows (the decode
// layer kernel needs them here; without it, batch 1 took 0.915–0.917 ms against 0.963–0.968 with
// the TMA GEMM from 1 row), O, gate-up and down on the TMA GEMM from 3 rows (batch 7 1.065–1.070
// against 1.124–1.129 ms with all four here up to 8 rows), QKV here up to 8 rows (3–8 rows 17–32
// µs faster than on the TMA GEMM, e.g. batch 8 0.999–1.006 against 1.021–1.030 ms; O, gate-up or
// down alone up to 8 rows were slower), the LM head up to 8 rows; the down projection after the
// SiLU·mul kernel (prefetch_gemm_silu).
struct PrefetchGemmRows {
  int qkv = 8;
  int o = 2;
  int gate_up = 2;
  int down = 2;
  int lm_head = 8;
};

// The most rows each of the bf16 projections runs through the TMA GEMM (tma_gemm.h); 0: never;
// at most kTmaGemmMaxRows. It comes after the prefetch GEMM and before the decode GEMM: a
// projection the prefetch GEMM does not take at m rows and this one does uses neither the decode
// GEMM, the skinny kernel nor cuBLASLt. The LM head (float logits) never takes it. The defaults
// follow runtime/model/NOTES.md (H200, 1B shape): every projection at 16 rows (the step 1.346 →
// 1.228 ms against cuBLASLt), O up to 32 (1.396–1.399 → 1.348–1.352 ms at 32 rows against O on
// cuBLASLt), gate-up and down up to 48 (1.580–1.591 → 1.565 at 48 rows), QKV up to 64 with at
// most 4 k slices (TmaGemmSplits: 1.540 against 1.584–1.589 ms at 48 rows,
// 1.785–1.789 against 1.812–1.814 at 56); the other projections past their limits made the step
// slower or no faster.
struct TmaGemmRows {
  int qkv = 64;
  int o = 32;
  int gate_up = 48;
  int down = 48;
};

// The most k slices (CTAs of a tile's cluster) ChooseTmaGemmConfig may give each projection on
// the TMA GEMM, each in [1, kTmaGemmMaxSplits]; qkv_at_32_rows replaces qkv for launches of
// 17–32 rows (x padded to 32). QKV's 48 tiles would take 5 slices at two CTAs per SM; in the step
// 4 measured faster at every row count from 9 to 64 (up to 40 µs at 20 rows), 2 slower
// everywhere. 3 had been faster at 24–32 rows while the QKV GEMM let RoPE in at its start; since
// it lets it in after its wait (tma_qkv_next_after_wait), 4 is faster at 17–32 rows too (32 rows:
// 1.285–1.291 against 1.302–1.304 ms, runtime/model/NOTES.md).
struct TmaGemmSplits {
  int qkv = 4;
  int qkv_at_32_rows = 4;
  int o = kTmaGemmMaxSplits;
  int gate_up = kTmaGemmMaxSplits;
  int down = kTmaGemmMaxSplits;
};

struct LlamaModelOptions {
  int num_kv_blocks = 0;  // KV blocks per layer (each holds block_size tokens of K and of V)
  int block_size = 64;    // tokens per KV block: a power of two >= 16
  // Rows up to which each projection uses the prefetch GEMM (each at most kPrefetchGemmMaxRows).
  PrefetchGemmRows prefetch_gemm_rows;
  // Prefetch GEMM CTAs per SM, 1 or 2 (ChoosePrefetchGemmConfig): with 1, the next projection's
  // CTAs fit beside this one's and prefetch while it streams; with 2, each projection keeps
  // twice the weights in flight but none prefetches before the previous one's CTAs leave. 2 was
  // faster at every batch (runtime/model/NOTES.md).
  int prefetch_gemm_ctas_per_sm = 2;
  // A down projection on the prefetch GEMM reads SiLU(gate)·up itself (with silu_in_down);
  // false: the SiLU·mul kernel runs first and the prefetch GEMM bulk-copies its output. false
  // measured faster (runtime/model/NOTES.md): the fused x is loaded through registers, a
  // latency-bound prologue after the wait.
  bool prefetch_gemm_silu = false;
  // A gate-up projection on the prefetch GEMM writes SiLU(gate)·up itself
  // (PrefetchGemmArgs::silu_mul_output), so the SiLU·mul kernel drops out and the down
  // projection reads its output; the same bits either way. It gives way to a down projection
  // that reads SiLU(gate)·up itself (silu_in_down with prefetch_gemm_silu). On an H200 (1B
  // shape) the step was 12–26 µs faster at 2 rows (0.939–0.947 against 0.959–0.965 ms) and the
  // same at 1 within 3 µs (runtime/runner/NOTES.md).
  bool prefetch_gate_up_silu = true;
  // The O and down projections, where their prefetch GEMM CTAs own at most 8 rows each (the 1B
  // shape's at 1–2 rows), fill each ring stage with their rows' two k halves
  // (PrefetchGemmConfig::row_halves), where alone they would fill half of it: twice the weight
  // bytes in flight in the same shared memory. On an H200 (1B shape) the step was 40–44 µs
  // faster at 1 row and 46–51 at 2, the same at 8; under TP=2 0–13 µs at 1–4 rows
  // (runtime/runner/NOTES.md).
  bool prefetch_row_halves = true;
  // Rows up to which each bf16 projection uses the TMA GEMM (each at most kTmaGemmMaxRows).
  TmaGemmRows tma_gemm_rows;
  // TMA GEMM CTAs per SM, 1 or 2, and the most k slices of each projection (ChooseTmaGemmConfig).
  int tma_gemm_ctas_per_sm = 2;
  TmaGemmSplits tma_gemm_max_splits;
  // The QKV projection on the TMA GEMM lets the next kernel (RoPE + KV append, then attention)
  // launch only once its own wait has returned (TmaGemmArgs::next_after_wait): those kernels read
  // everything after their waits and, let in at its start, crowd the SMs while QKV streams.
  bool tma_qkv_next_after_wait = true;
  // A gate-up projection on the TMA GEMM writes SiLU(gate)·up itself (TmaGemmArgs::silu_mul), so
  // the SiLU·mul kernel drops out and the down projection reads its output; the same bits either
  // way. It gives way to a down projection that reads SiLU(gate)·up itself (silu_in_down). On an
  // H200 (1B shape) the step was 4–20 µs faster from 3 to 48 rows (batch 8: 1.040–1.044 against
  // 1.060 ms; 32: 1.290–1.294 against 1.304–1.306; runtime/runner/NOTES.md).
  bool tma_gate_up_silu = true;
  // Rows up to which each projection uses the decode GEMM (each at most kDecodeGemmMaxRows).
  DecodeGemmRows decode_gemm_rows;
  // A down projection on the decode GEMM (or on the prefetch GEMM with prefetch_gemm_silu) reads
  // SiLU(gate)·up itself, so the SiLU·mul kernel drops out (every CTA recomputes SiLU for its
  // slice of x, cheap at few rows).
  bool silu_in_down = true;
  // RoPE and the KV append run as one kernel (rope_kv_append.h) where it takes the shape.
  bool fuse_rope_append = true;
  // In decode-only steps (a decode part, no prefill part) of at most this many token rows (0:
  // none) that the decode layer kernel does not run, the decode attention kernel does the RoPE
  // and the KV append itself (DecodeRopeAppendDevice) and the RoPE + KV append kernel drops out.
  // The same bits either way. 8: on an H200 (1B shape) the step was 20 µs faster at 4 and 8 rows
  // (1.033 against 1.052–1.056 ms at 4, 1.083–1.084 against 1.105–1.106 at 8); from 9 rows,
  // where the QKV projection takes the TMA GEMM, it was slower (1.419 against 1.298 at 32);
  // with the decode layer kernel (1–2 rows), ending it after QKV was slower too. Without the
  // layer kernel, 10–28 µs faster at 2 rows than the RoPE kernel (0.971–0.973 against
  // 0.982–1.000 ms; runtime/runner/NOTES.md).
  int rope_in_attention_rows = 8;
  // The fewest token rows of those steps (at least 1). 1: since decode attention loads the older
  // tokens of the step that holds the new one before its wait, rotating in attention at one row
  // was 20–28 µs faster than the RoPE kernel on an H100 (1.099–1.107 against 1.124–1.129 ms,
  // three rounds, 2026-11-27); before that change the RoPE kernel had been 9–19 µs faster at one
  // row on an H200 (0.894–0.898 against 0.907–0.917 ms; runtime/runner/NOTES.md).
  int rope_in_attention_min_rows = 1;
  // GEMMs the decode GEMM does not take with at most this many rows use the skinny kernel (0
  // disables it; at most kSkinnyGemmMaxRows). 2: on an H200 the 1B decode step was faster with it
  // at 1 row (1.169 against 1.251 ms) and even at 2, slower at 4 and 8 (runtime/runner/NOTES.md).
  int skinny_gemm_max_rows = 2;
  size_t gemm_workspace_bytes = Gemm::kDefaultWorkspaceBytes;
  // false leaves attention out of Forward (its output stays zero), and with it the RoPE + KV
  // append of the steps whose attention does that (rope_in_attention_min_rows..
  // rope_in_attention_rows): only for benchmarks that time the rest of the step. The results are
  // then not the model's.
  bool run_attention = true;
  // Likewise for benchmarks only, false leaves a kind of small kernel out of the steps that run
  // without the decode layer kernel (more rows than layer_kernel_rows, one GPU): RoPE with the
  // KV append; the RMSNorm and add + RMSNorm kernels (not the folded or all-reduce ones); the
  // SiLU·mul kernel. Their readers then read stale values.
  bool run_rope_append = true;
  bool run_norms = true;
  bool run_silu_mul = true;
  // Tensor parallelism (not owned; must outlive the model): the weights are this rank's shard
  // and the O and down projections are all-reduced over it. Null: one GPU, full weights.
  Communicator* communicator = nullptr;
  // With tensor parallelism, each all-reduce runs fused with the residual add + RMSNorm after it
  // (Communicator::AllReduceAddRmsNorm, one kernel instead of two) for the steps whose token
  // count the communicator supports it for; the results are the same bits either way. false:
  // always the all-reduce and a separate norm (for comparisons).
  bool fuse_allreduce_norm = true;
  // Where a step's QKV and gate-up projections both take the prefetch GEMM, the residual add +
  // RMSNorm before each runs in that GEMM's prologue instead of its own kernel (see the file
  // comment); the results are the same bits either way. Off by default: on an H200 (1B shape)
  // the step was as fast at batch 1 and slower at 2 to 8 (1.240 against 1.170 ms at 8): without
  // the norm kernel between them, a GEMM's CTAs find no room beside the previous GEMM's and
  // cannot fill their ring before the wait (runtime/model/NOTES.md).
  bool fold_norm_into_gemm = false;
  // Steps of at most this many token rows (at most kDecodeLayerMaxRows; 0: none) run each piece
  // as one launch of the decode layer kernel (decode_layer.h: the previous layer from its O
  // projection through its down projection, then the next layer's QKV projection with its RoPE +
  // KV append, or the final norm; the weights stream across the projections). The same bits as
  // the kernel-per-operation step; only where every projection of the layer takes the prefetch
  // GEMM at that row count (whose arithmetic it repeats), and not with tensor parallelism. 0: on
  // an H200 (1B shape) it had been faster at 1 and 2 rows (0.961 against 0.994 ms, 1.016 against
  // 1.040) and slower at 4 (1.141 against 1.100; runtime/model/NOTES.md); since the norm kernels
  // load their weights before their wait the kernel chain is faster at 1 and 2 rows too (0.915–
  // 0.917 against 0.928–0.931 ms, 0.971–0.973 against 0.994–1.004; runtime/runner/NOTES.md).
  int layer_kernel_rows = 0;
};

// The device views one step reads and writes. All pointers are device memory (but for
// next_tokens_mirror) owned by the caller and must stay at the same addresses for as long as a
// graph captured with them lives.
struct LlamaStepArgs {
  int num_tokens = 0;  // padded token count: rows of every per-token activation and GEMM
  int num_rows = 0;    // padded sequence count: rows of the logits
  const int32_t* token_ids = nullptr;        // [num_tokens]; padding -1 (a zero embedding)
  const int32_t* positions = nullptr;        // [num_tokens]; RoPE positions
  const int32_t* last_token_rows = nullptr;  // [num_rows]: each sequence's last token; -1 padding
  const int32_t* block_table = nullptr;      // [plan max_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  AttentionPlanPartDevice decode;   // the uploaded plan's parts (work_capacity 0: disabled)
  AttentionPlanPartDevice prefill;
  void* activations = nullptr;  // ActivationBytes(num_tokens, num_rows), 256-byte aligned
  float* logits = nullptr;      // [num_rows, vocab]
  int32_t* next_tokens = nullptr;  // [num_rows]
  // [num_rows] or null: the same tokens once more, in device or pinned host memory (the Runner
  // reads them there after the step, with no copy of its own).
  int32_t* next_tokens_mirror = nullptr;
};

// Returns InvalidArgument for step views no piece or attention of a step may be launched with:
// sizes out of order (1 <= num_rows <= num_tokens), a null or not 256-byte aligned activation
// region, a null view, max_blocks_per_seq below 1 or no enabled plan part. Host-only (reads no
// pointer); LlamaModel's Forward, RunPiece and RunAttention refuse these before they enqueue
// anything. Thread-safe.
absl::Status CheckLlamaStepArgs(const LlamaStepArgs& args);

// Step views that CheckLlamaStepArgs accepted, for a caller that runs one step through several
// entry points: the Runner's piecewise step checks its views once, before it replays the first
// piece, then runs every layer's attention with them (LlamaModel::RunAttention's overload, which
// checks only the layer). Only Check makes one, so holding one means the check ran. Holds a copy
// of the views (their pointers are not owned). Host-only; thread-compatible (Check is
// thread-safe).
class CheckedLlamaStepArgs {
 public:
  // Returns `args` checked, or CheckLlamaStepArgs's InvalidArgument.
  static absl::StatusOr<CheckedLlamaStepArgs> Check(const LlamaStepArgs& args);

  // Returns the views Check accepted: a reference into this object, valid while it lives (the
  // pointers in it are the caller's, not owned).
  const LlamaStepArgs& args() const { return args_; }

 private:
  explicit CheckedLlamaStepArgs(const LlamaStepArgs& args) : args_(args) {}

  LlamaStepArgs args_;
};

// Returns InvalidArgument for what LlamaModel::Create refuses in `shape` and `options` before it
// allocates: the shape, the kernels' row limits and choices, the KV cache's layout. Host-only, so
// a caller (the Runner) can check before it uploads weights.
absl::Status CheckLlamaModelOptions(const LlamaShape& shape, const LlamaModelOptions& options);

class LlamaModel {
 public:
  // The projections of a layer and the LM head (each has its own GEMM path, DecodeGemmRows).
  enum class Proj { kQkv, kO, kGateUp, kDown, kLmHead };

  // Takes the weights, allocates the KV cache (options.num_kv_blocks blocks for every layer, K
  // and V) and creates the GEMM workspace. InvalidArgument for a shape or option the kernels do
  // not support (head_dim other than 64 or 128, a query-head group size the decode kernel lacks,
  // a bad block size); ResourceExhausted when the cache does not fit. `gemm` (optional) is used
  // instead of creating one with options.gemm_workspace_bytes. Not during capture.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaDeviceWeights weights,
                                                            const LlamaModelOptions& options,
                                                            std::unique_ptr<Gemm> gemm = nullptr);

  // Returns the activation bytes one step needs at these padded sizes (see the file comment).
  static size_t ActivationBytes(const LlamaShape& shape, int num_tokens, int num_rows);

  // Returns the activation bytes per token, without alignment padding:
  // (5 hidden + qkv_rows + q_width + 3 ffn) × 2, counting the last-token rows and the
  // mid_residual rows as one hidden row per token each (num_rows ≤ num_tokens; mid_residual has
  // at most kPrefetchGemmMaxRows rows). ActivationBytes(n, r ≤ n) ≤ this × n + kActivationSlack.
  static int64_t ActivationBytesPerToken(const LlamaShape& shape);

  // Alignment padding ActivationBytes may add on top of ActivationBytesPerToken × num_tokens.
  static constexpr size_t kActivationSlack = 9 * 256;

  // Returns the KV cache bytes one block of every layer takes (K and V): what the memory planner
  // calls the block size in bytes.
  static size_t KvBlockBytes(const LlamaShape& shape, int block_size);

  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Chooses the GEMM algorithms for a step of these padded sizes. Not during capture; a step
  // whose sizes were not prepared prepares them when run eagerly.
  absl::Status Prepare(int num_tokens, int num_rows);

  // Returns whether a step of num_tokens (padded) rows folds the add + RMSNorm before the QKV and
  // gate-up projections into their prefetch GEMMs (see the file comment): the same answer for
  // every layer and piece of the step, at capture and replay.
  bool FoldsNorms(int num_tokens) const;

  // Returns whether a step of num_tokens (padded) rows takes SiLU(gate)·up from the gate-up
  // projection's GEMM (LlamaModelOptions::prefetch_gate_up_silu on the prefetch GEMM,
  // tma_gate_up_silu on the TMA GEMM), without the SiLU·mul kernel.
  bool GateUpWritesSiluMul(int num_tokens) const {
    return MlpPathFor(num_tokens).gate_up_silu.any();
  }

  // Returns whether a step of num_tokens (padded) rows runs its pieces through the decode layer
  // kernel (LlamaModelOptions::layer_kernel_rows): the same answer at capture and replay.
  bool UsesLayerKernel(int num_tokens) const;

  // Returns whether the step's attention does its RoPE and KV append
  // (LlamaModelOptions::rope_in_attention_min_rows..rope_in_attention_rows): the same answer for
  // every piece of a step, at capture and replay.
  bool RopeInAttention(const LlamaStepArgs& args) const;

  // Enqueues the whole step: every piece and attention, with `args` checked once.
  // InvalidArgument, before anything is enqueued, for the `args` CheckLlamaStepArgs refuses.
  // Callable during capture for prepared sizes.
  absl::Status Forward(const LlamaStepArgs& args, cudaStream_t stream);

  // Returns the number of pieces: layers + 1.
  int num_pieces() const { return shape().layers + 1; }

  // Enqueues piece `piece` in [0, num_pieces()) (see the file comment). InvalidArgument, before
  // anything is enqueued, for a piece outside that range or the `args` CheckLlamaStepArgs
  // refuses (checked at every call: each is its own entry point). Callable during capture.
  absl::Status RunPiece(int piece, const LlamaStepArgs& args, cudaStream_t stream);

  // Enqueues layer `layer`'s attention over the KV cache with the step's plan. InvalidArgument,
  // before anything is enqueued, for a layer outside [0, layers) and the `args` RunPiece
  // refuses. Callable during capture.
  absl::Status RunAttention(int layer, const LlamaStepArgs& args, cudaStream_t stream);

  // RunAttention with views checked once per step rather than at every call (the Runner's
  // piecewise step, which runs it for every layer): InvalidArgument, before anything is
  // enqueued, only for a layer outside [0, layers). Callable during capture.
  absl::Status RunAttention(int layer, const CheckedLlamaStepArgs& args, cudaStream_t stream);

  const LlamaShape& shape() const { return weights_.shape(); }
  const LlamaDeviceWeights& weights() const { return weights_; }
  const PagedKvLayout& kv_layout() const { return kv_layout_; }
  const LlamaModelOptions& options() const { return options_; }
  // Returns the device bytes of the KV cache (every layer, K and V).
  size_t kv_cache_bytes() const { return kv_.size(); }
  // Returns the start of the KV cache (for tests and benchmarks that fill it).
  void* kv_cache_data() const { return kv_.data(); }
  // Returns layer `layer`'s K or V pool: [num_blocks, kv_heads, block_size, head_dim].
  void* k_cache(int layer) const;
  void* v_cache(int layer) const;
  // Returns the GEMM workspace bytes.
  size_t gemm_workspace_bytes() const { return gemm_->workspace_bytes(); }
  // Returns the decode GEMM's device bytes (split-K partials and counters).
  size_t decode_gemm_workspace_bytes() const {
    return decode_workspace_.size() + decode_counters_.size();
  }

 private:
  struct Activations;
  // The decode layer kernel's launch shape per row count (stages 0: not taken) and its grid
  // barrier's state.
  struct LayerKernel {
    DecodeLayerConfig configs[kDecodeLayerMaxRows + 1];
    // Whether a step of m rows runs it (UsesLayerKernel), decided once at construction.
    bool used[kDecodeLayerMaxRows + 1] = {};
    DeviceBuffer sync;
  };

  LlamaModel(LlamaDeviceWeights weights, const LlamaModelOptions& options,
             const PagedKvLayout& kv_layout, DeviceBuffer kv, std::unique_ptr<Gemm> gemm,
             int sm_count, DeviceBuffer decode_workspace, DeviceBuffer decode_counters,
             LayerKernel layer_kernel);

  Activations Carve(const LlamaStepArgs& args) const;
  // The GEMMs Linear tries for one projection's y [m, n] = op(x) [m, k] · Wᵀ, in its order: each
  // configuration is set where that GEMM takes the shape, and the first whose kernel also takes
  // the step's pointers runs; then the skinny kernel (where `skinny`) and cuBLASLt. A pure
  // function of the projection, the input and (m, n, k) (LinearPathFor).
  struct LinearPath {
    Proj proj = Proj::kQkv;
    DecodeGemmInput input = DecodeGemmInput::kPlain;
    int64_t m = 0, n = 0, k = 0;
    std::optional<PrefetchGemmConfig> prefetch;
    std::optional<TmaGemmConfig> tma;
    std::optional<DecodeGemmConfig> decode;
    bool skinny = false;
  };
  // The launch shape of a gate-up projection that writes SiLU(gate)·up itself: on the prefetch
  // GEMM (prefetch_gate_up_silu) or the TMA GEMM (tma_gate_up_silu).
  struct GateUpSilu {
    std::optional<PrefetchGemmConfig> prefetch;
    std::optional<TmaGemmConfig> tma;
    bool any() const { return prefetch.has_value() || tma.has_value(); }
  };
  // How the MLP of a step of m rows (without the decode layer kernel) runs: the same answer for
  // every layer and piece of the step, at capture and replay.
  struct MlpPath {
    bool folded_norm = false;   // FoldsNorms: the gate-up GEMM adds and normalises its own x
    bool silu_in_down = false;  // FusesSiluMul: the down GEMM applies SiLU·mul to gate_up
    GateUpSilu gate_up_silu;    // the gate-up GEMM writes SiLU(gate)·up (neither of the above)
  };  // The SiLU·mul kernel runs where neither silu_in_down nor gate_up_silu holds.
  // A step's decisions. Each depends only on the step's sizes and plan parts, which its capture
  // key fixes, so one set serves every layer and piece of the step: Forward decides once per
  // step, RunPiece once per call, and the pieces read them instead of deciding again per layer.
  struct StepDecisions {
    bool layer_kernel = false;          // UsesLayerKernel
    bool fused_allreduce_norm = false;  // FusesAllReduceNorm
    bool attention_rope = false;        // AttentionTakesRope
    MlpPath mlp;                        // MlpPathFor; mlp.folded_norm is FoldsNorms
    // Each projection at the step's token rows, the LM head at its sequence rows; the down
    // projection with the SiLU·mul input where mlp.silu_in_down holds.
    LinearPath qkv, o, gate_up, down, lm_head;
  };
  // Returns the decisions of a step with `args` (which CheckLlamaStepArgs accepted).
  StepDecisions DecideStep(const LlamaStepArgs& args) const;
  // RunPiece and RunAttention for `args` that CheckLlamaStepArgs accepted, a piece or layer in
  // range, `step` from DecideStep(args) and `a` carved from args.activations: the entry points
  // check, decide and carve, then run these.
  absl::Status RunCheckedPiece(int piece, const LlamaStepArgs& args, const StepDecisions& step,
                               const Activations& a, cudaStream_t stream);
  // Attention needs only RopeInAttention of the step's decisions (a few integer compares), so
  // RunAttention, which the piecewise step calls once per layer, makes no StepDecisions.
  absl::Status RunCheckedAttention(int layer, const LlamaStepArgs& args, const Activations& a,
                                   cudaStream_t stream);
  // Returns InvalidArgument for a layer outside [0, layers) (RunAttention's check of `layer`).
  absl::Status CheckLayer(int layer) const;
  // RopeInAttention without its run_attention term: the steps whose attention would rotate.
  bool AttentionTakesRope(const LlamaStepArgs& args) const;
  // Returns the GEMMs Linear tries for the projection (see LinearPath).
  LinearPath LinearPathFor(Proj proj, int64_t m, int64_t n, int64_t k,
                           DecodeGemmInput input) const;
  // y [m, n] = op(x) [m, k] · Wᵀ through the first GEMM of `path` that takes the pointers (see
  // the file comment); op is SiLU·mul only where FusesSiluMul holds.
  absl::Status Linear(const LinearPath& path, const __nv_bfloat16* x, const __nv_bfloat16* w,
                      void* y, cudaStream_t stream);
  // y [m, n] = (RMSNorm(h) * norm_weight) · Wᵀ through the prefetch GEMM of `path` with the norm
  // in its prologue: h = x (residual_in null) or bf16(x + residual_in); h goes to residual_out.
  // Only where FoldsNorms holds (the QKV or gate-up path of the step's decisions).
  absl::Status FoldedNormLinear(const LinearPath& path, const __nv_bfloat16* x,
                                const __nv_bfloat16* residual_in, __nv_bfloat16* residual_out,
                                const __nv_bfloat16* norm_weight, const __nv_bfloat16* w, void* y,
                                cudaStream_t stream);
  // Returns the prefetch GEMM's launch shape for the projection at m rows, or nullopt where the
  // projection does not run through it.
  std::optional<PrefetchGemmConfig> PrefetchGemmFor(Proj proj, int64_t m, int64_t n, int64_t k,
                                                    DecodeGemmInput input) const;
  // Returns whether the projection runs through the prefetch GEMM at m rows.
  bool UsesPrefetchGemm(Proj proj, int64_t m, int64_t n, int64_t k, DecodeGemmInput input) const;
  // Returns whether the projection runs through the prefetch GEMM at m rows and that takes a
  // norm input there.
  bool PrefetchGemmTakesNorm(Proj proj, int64_t m, int64_t n, int64_t k) const;
  // The same for the TMA GEMM (plain input, bf16 output only).
  std::optional<TmaGemmConfig> TmaGemmFor(Proj proj, int64_t m, int64_t n, int64_t k,
                                          DecodeGemmInput input) const;
  // The same for the decode GEMM.
  std::optional<DecodeGemmConfig> DecodeGemmFor(Proj proj, int64_t m, int64_t n, int64_t k,
                                                DecodeGemmInput input) const;
  // Returns whether the projection runs through the decode GEMM at m rows.
  bool UsesDecodeGemm(Proj proj, int64_t m, int64_t n, int64_t k, DecodeGemmInput input) const;
  // Returns whether the down projection at m rows reads SiLU(gate)·up of the gate-up output
  // itself (through the prefetch or the decode GEMM).
  bool FusesSiluMul(int64_t m, int64_t n, int64_t k) const;
  // Returns the MlpPath of a step of m rows.
  MlpPath MlpPathFor(int64_t m) const;
  // act [m, ffn] = SiLU(gate)·up of x · Wᵀ for the gate-up weights W through `path` (from
  // MlpPathFor(m); any() must hold).
  absl::Status GateUpSiluMul(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* act,
                             int64_t m, const GateUpSilu& path, cudaStream_t stream);
  bool UsesSkinny(int64_t m) const;
  // Layer `layer` from its input norm through the KV append.
  absl::Status PreAttention(int layer, const LlamaStepArgs& args, const StepDecisions& step,
                            const Activations& a, cudaStream_t stream);
  // Piece `piece` where UsesLayerKernel holds: one launch of the decode layer kernel (after the
  // embeddings in piece 0; before the head in the last piece).
  absl::Status RunLayerKernelPiece(int piece, const LlamaStepArgs& args, const StepDecisions& step,
                                   const Activations& a, cudaStream_t stream);
  // The last piece's end: each sequence's last token of `normed`, logits, greedy tokens.
  absl::Status Head(const LlamaStepArgs& args, const StepDecisions& step, const Activations& a,
                    const __nv_bfloat16* normed, cudaStream_t stream);
  // Layer `layer` from the O projection through the down projection.
  absl::Status PostAttention(int layer, const LlamaStepArgs& args, const StepDecisions& step,
                             const Activations& a, cudaStream_t stream);
  // Where the O and down projections write: `hidden`, or with tensor parallelism the partial
  // sum's buffer that AllReduceProjection sums into `hidden`.
  __nv_bfloat16* ProjectionOutput(const Activations& a) const;
  // With tensor parallelism: hidden = the sum over ranks of the projection's partial sums.
  absl::Status AllReduceProjection(const Activations& a, int num_tokens, cudaStream_t stream);
  // Returns whether a step of num_tokens rows fuses each all-reduce with the add + RMSNorm after
  // it (the same answer for every layer and piece of the step, on every rank, at capture and
  // replay: it depends only on the sizes and the communicator).
  bool FusesAllReduceNorm(int num_tokens) const;
  // The fused form: residual += the sum over ranks of the partial sums (in `normed`); hidden =
  // RMSNorm(residual) * weight.
  absl::Status AllReduceAddRmsNorm(const Activations& a, int num_tokens,
                                   const __nv_bfloat16* weight, cudaStream_t stream);

  LlamaDeviceWeights weights_;
  LlamaModelOptions options_;
  PagedKvLayout kv_layout_;
  DeviceBuffer kv_;
  std::unique_ptr<Gemm> gemm_;
  int sm_count_;
  DeviceBuffer decode_workspace_;  // float split-K partials of the decode GEMM
  DeviceBuffer decode_counters_;   // int32 split counters, zero between launches
  LayerKernel layer_kernel_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_LLAMA_MODEL_H_
