// The decode layer kernel: everything of a Llama decoder step between two attentions in one
// persistent launch, for steps of at most kDecodeLayerMaxRows token rows. One CTA per SM; each
// CTA owns a fixed share of the O, down and QKV rows and claims gate-up rows from a counter, and
// a producer warp streams the CTA's share of the launch's weights (O, gate-up, down, then the
// next layer's QKV) through one ring of shared memory with the bulk-copy engine, from the
// kernel's start and across the phase boundaries: the weights depend on no activation. The 8
// compute warps run the phases in order and meet at a grid barrier after each projection (its
// output is the next phase's input on every CTA):
//
//   finish (layer l−1, after its attention):
//     O:        hidden = attn · Woᵀ
//     gate-up:  x = RMSNorm(residual + hidden) · post_norm (mid_residual = the sum, by CTA 0);
//               act = SiLU(x · Wgateᵀ) · (x · Wupᵀ): each CTA owns the same rows of gate and up
//     down:     hidden = act · Wdownᵀ
//   then start (layer l, up to its KV append) or the final norm:
//     QKV:      x = RMSNorm(mid_residual + hidden) · input_norm (residual = the sum), or for the
//               first layer x = RMSNorm(residual); qkv = x · Wqkvᵀ
//     RoPE + KV append of each token (rope_kv_append.h's arithmetic)
//   or final:   residual = mid_residual + hidden; normed = RMSNorm(residual) · final_norm
//
// Every product, norm and SiLU·mul is computed with the prefetch GEMM's and the norm and SiLU·mul
// kernels' arithmetic, in the same order (internal/prefetch_stage.cuh), so the results are those
// of the separate kernels; every order is fixed, so an eager run and a graph agree bit for bit.
// The kernel is launched with programmatic dependent launch: its weights stream while the
// kernel before it (attention) finishes. It needs every CTA resident at once: one per SM
// (ChooseDecodeLayerConfig checks that one fits; DecodeLayerSupports that the grid has one per SM
// and that each takes more than half an SM's shared memory, so two launches never share one). No
// other kernel of the stream runs beside it except the ones launched after it, which wait for it.
//
//   kiln::DecodeLayerArgs a;
//   a.m = 1;  a.shape = {hidden, q_width, ffn, heads, kv_heads, head_dim, eps, theta, scaling};
//   a.finish = true;  a.o = ...; a.post_norm = ...; a.gate_up = ...; a.down = ...;
//   a.start = true;   a.norm = ...; a.qkv_w = ...;   // the next layer's input norm and QKV
//   a.positions = ...; a.plan = ...; a.kv = ...;       // as RopeKvAppendParams
//   a.attn = ...; a.hidden = ...; a.residual = ...; a.mid_residual = ...; a.act = ...; a.qkv = ...;
//   a.grid_sync = sync;   // kDecodeLayerSyncBytes of zeros, owned by the caller
//   a.work_set = launch % 2;  a.previous_work_set = 1 - launch % 2;   // alternate per launch
//   const kiln::DecodeLayerConfig c = kiln::ChooseDecodeLayerConfig(a.m, a.shape, sm_count);
//   if (kiln::DecodeLayerSupports(a, c)) CUDA_RETURN_IF_ERROR(kiln::LaunchDecodeLayer(a, c, s));
//
// Speed (H200, 1B shape, runtime/model/NOTES.md): 42.7 µs per launch at one row (2.85 TB/s of
// weights), against about 45 µs for the same work as a chain of kernels with programmatic
// dependent launch; the products run at ~4.8 TB/s from the prefilled ring, and each of the four
// grid barriers costs 2–5 µs (arrival skew, then a trip to L2 and a poll while the other SMs
// stream). The decode step is 3% faster with it at one row and 2% at two, slower from four rows
// (x takes more shared memory, the ring gets shallower): LlamaModelOptions::layer_kernel_rows.
//
// Needs compute capability 9.0. Callable during capture once PrepareDecodeLayer has run; one
// launch at a time per grid_sync buffer (the stream orders them).
#ifndef KILN_RUNTIME_MODEL_DECODE_LAYER_H_
#define KILN_RUNTIME_MODEL_DECODE_LAYER_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention/attention_params.h"

namespace kiln {

// The most token rows one launch takes (the N of the tensor-core tile).
inline constexpr int kDecodeLayerMaxRows = 8;
// Bytes of the launches' shared state: the grid barrier's arrival count and three work counters
// (zeros before the first launch; launches sharing it must have the same grid size).
inline constexpr size_t kDecodeLayerSyncBytes = 32;
// Work counter sets in the shared state.
inline constexpr int kDecodeLayerWorkSets = 3;
// The most ring stages of the weight stream.
inline constexpr int kDecodeLayerMaxStages = 16;

struct DecodeLayerShape {
  int hidden = 0;
  int q_width = 0;  // heads × head_dim
  int ffn = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float eps = 0.0f;
  double theta = 0.0;  // RoPE base
  RopeScaling rope_scaling;  // the model's RoPE frequency scaling; none by default
  int qkv_rows() const { return (heads + 2 * kv_heads) * head_dim; }
};

struct DecodeLayerArgs {
  int m = 0;  // token rows (padded), 1..kDecodeLayerMaxRows
  DecodeLayerShape shape;

  // The previous layer's O projection through its down projection.
  bool finish = false;
  const __nv_bfloat16* o = nullptr;          // [hidden, q_width]
  const __nv_bfloat16* post_norm = nullptr;  // [hidden]
  const __nv_bfloat16* gate_up = nullptr;    // [2 ffn, hidden]: gate rows, then up rows
  const __nv_bfloat16* down = nullptr;       // [hidden, ffn]

  // Then the next layer up to its KV append (start), or with final the final norm. Without
  // finish, start is the first layer: x = RMSNorm(residual), residual unchanged.
  bool start = false;
  bool final_norm = false;
  const __nv_bfloat16* norm = nullptr;   // [hidden]: the layer's input norm, or the final norm
  const __nv_bfloat16* qkv_w = nullptr;  // [qkv_rows, hidden]
  const int32_t* positions = nullptr;    // [m]: RoPE positions (from the step's upload)
  AttentionPlanPartDevice plan;          // seq_q_start, seq_kv_len, max_seqs (as RoPE + append)
  PagedKvDevice kv;                      // the layer's caches [blocks, kv_heads, block_size, hd]

  // Activations, [m, width] each.
  const __nv_bfloat16* attn = nullptr;   // q_width: attention output (finish)
  __nv_bfloat16* hidden = nullptr;       // hidden: O and down outputs
  __nv_bfloat16* residual = nullptr;     // hidden: the residual at the launch's start and end
  __nv_bfloat16* mid_residual = nullptr; // hidden: the residual between O and down
  __nv_bfloat16* act = nullptr;          // ffn: SiLU(gate)·up
  __nv_bfloat16* qkv = nullptr;          // qkv_rows (start)
  __nv_bfloat16* normed = nullptr;       // hidden: the final norm's output (final_norm)
  uint32_t* grid_sync = nullptr;         // kDecodeLayerSyncBytes, 8-byte aligned
  // The gate-up rows are claimed by the CTAs from a counter, so that an SM that streams faster
  // takes more of them: counter work_set (of kDecodeLayerWorkSets) of grid_sync. Consecutive
  // launches on grid_sync must use different sets, and each names its predecessor's set in
  // previous_work_set (-1: none), which it clears (its predecessor has completed by then; the
  // launch after it cannot start before this one's CTAs leave their SMs).
  int work_set = 0;
  int previous_work_set = -1;
  // Optional, for profiling: [ctas][kDecodeLayerTraceSlots] %globaltimer stamps (ns) of each
  // CTA: its start, the end of its wait for the kernel before, then per phase the end of the x
  // staging, of the last stage's products and of the grid barrier.
  uint64_t* trace = nullptr;
};

inline constexpr int kDecodeLayerTraceSlots = 2 + 3 * 4;

struct DecodeLayerConfig {
  int ctas = 0;     // one per SM
  int stages = 0;   // ring slots of 16 rows × 1024 k
  size_t shared_bytes = 0;
  // Stages of a phase the producer may issue before the grid barrier that ends the phase before
  // it (≥ stages: no limit, the ring runs ahead through the barrier).
  int run_ahead = 2;
  std::string ToString() const;
};

// The launch shape for m rows of `shape` on `sm_count` SMs (the current device's count): the
// ring as deep as the shared memory left beside one decode-attention CTA allows (so that the
// next launch's weights stream while attention runs), or the whole of an SM's shared memory
// where that leaves fewer than two stages. stages 0 where even that does not fit, where a CTA of
// that size cannot be resident on an SM, or on a GPU before compute capability 9.0. Not during
// capture (it prepares the kernel).
DecodeLayerConfig ChooseDecodeLayerConfig(int m, const DecodeLayerShape& shape, int sm_count);

// Returns the shared memory of one CTA with `stages` ring stages at m rows of `shape`.
size_t DecodeLayerSharedBytes(int m, const DecodeLayerShape& shape, int stages);

// Returns whether LaunchDecodeLayer takes `args` with `config`: compute capability 9.0, 1 ≤ m ≤
// kDecodeLayerMaxRows, widths multiples of 16 with hidden, q_width and ffn at most 8192, head_dim
// a multiple of 16 up to 256, at least two stages and more than half of an SM's shared memory
// (two launches' CTAs never share an SM), one CTA per SM of the current device, the pointers of
// the parts asked for set and aligned (the KV pools too, and block-table rows of at least one
// block), finish or start asked for, valid work sets.
bool DecodeLayerSupports(const DecodeLayerArgs& args, const DecodeLayerConfig& config);

// Sets the kernel's shared-memory limit; not during capture. Idempotent.
cudaError_t PrepareDecodeLayer();

// Enqueues the launch. cudaErrorInvalidValue where DecodeLayerSupports is false.
cudaError_t LaunchDecodeLayer(const DecodeLayerArgs& args, const DecodeLayerConfig& config,
                              cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_DECODE_LAYER_H_
