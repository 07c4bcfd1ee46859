// y = op(x) · Wᵀ for the few rows of a decode step (m ≤ 8), with the weights bulk-copied into
// shared memory before the kernel waits for the one before it: x [m, k] bf16, W [n, k] bf16
// (PyTorch's Linear layout), y [m, n] bf16 or float, float accumulation. op is the identity;
// SiLU(gate)·up for the down projection, whose x is then the gate-up projection's output [m, 2k]
// (gate first), so the SiLU·mul kernel drops out of the step (slower in a decode step than that
// kernel followed by a plain launch: runtime/model/NOTES.md); or the RMSNorm that precedes the
// QKV and gate-up projections, alone or after the residual add, so the norm kernel drops out.
//
//   kiln::PrefetchGemmConfig config = kiln::ChoosePrefetchGemmConfig(m, n, k, sm_count);
//   kiln::PrefetchGemmArgs args{x, w, y, m, n, k};
//   if (kiln::PrefetchGemmSupports(args, config)) {
//     CUDA_RETURN_IF_ERROR(kiln::LaunchPrefetchGemm(args, config, stream));
//   }
//   // residual_b = bf16(delta + residual_a); y = (RMSNorm(residual_b) * post_norm) · Wᵀ: the bits
//   // of LaunchFusedAddRmsNorm (rms_norm.h) followed by the plain GEMM, one kernel.
//   // act = SiLU(x · W_gateᵀ)·(x · W_upᵀ) for a gate-up W [2F, k] (gate rows first): the bits of
//   // the plain GEMM followed by LaunchSiluMul (silu_mul.h), one kernel.
//   kiln::PrefetchGemmArgs gate_up{x, w_gate_up, act, m, 2 * F, k};
//   gate_up.silu_mul_output = true;
//   kiln::PrefetchGemmArgs fold{delta, w, y, m, n, k, kiln::PrefetchGemmInput::kAddRmsNorm};
//   fold.residual_in = residual_a;
//   fold.residual_out = residual_b;  // not residual_a: every CTA reads that one
//   fold.norm_weight = post_norm;
//   fold.eps = 1e-5f;
//
// Why: at m ≤ 8 a projection's time is its weight bytes over memory bandwidth plus what it costs to
// start and finish. The weights do not depend on the kernel before, only x does. Each CTA owns a
// contiguous range of W's rows, which it streams through a ring of shared-memory stages (16 rows ×
// 1024 k each) with the bulk-copy engine (cp.async.bulk, completing on an mbarrier). Launched with
// programmatic dependent launch, the CTAs become resident while the kernels before them still run
// and fill the ring (up to ~100 KiB per CTA) before griddepcontrol.wait; only then do they read x
// (one bulk copy per row, or through SiLU·mul or the norm where asked), multiply on the tensor
// cores (mma.m16n8k16, x padded to 8 rows) and write y. Through the norm, every CTA computes the
// whole normed x [m, k] in shared memory (2 × m rows of k read from L2 through registers: at 8 rows
// as many bytes as a CTA's share of the QKV weights, one reason the fold did not speed up the 1B
// step, runtime/model/NOTES.md) and CTA 0 alone writes the new residual, so the residual it reads
// and the one it writes must be different buffers. ChoosePrefetchGemmConfig sizes the ring so that
// two CTAs fit on one SM: two of this projection by default; with one CTA per SM, the next
// projection's CTAs fit beside this one's and prefetch while it streams, which measured slower in a
// decode step (runtime/model/NOTES.md, with the per-projection figures).
//
// Every sum has a fixed order (k in stage order, then the 8 warps in warp order), so y is bitwise
// reproducible for a given (m, n, k, config): an eager run and a graph agree bit for bit. The norm
// repeats rms_norm.cu's arithmetic and its reduction order (that kernel's block of
// ceil(k / 8 / 32) warps, emulated), so its rows are the norm kernel's bits. Needs
// compute capability 9.0 (PrefetchGemmSupports is false elsewhere). Callable during capture once
// PreparePrefetchGemm has run (or any launch ran eagerly); thread-safe.
#ifndef KILN_RUNTIME_MODEL_PREFETCH_GEMM_H_
#define KILN_RUNTIME_MODEL_PREFETCH_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// The most rows of x the kernel takes (one tensor-core tile of x).
inline constexpr int kPrefetchGemmMaxRows = 8;
// The most ring stages a configuration may have.
inline constexpr int kPrefetchGemmMaxStages = 16;
// The most dynamic shared memory a CTA may use: the opt-in limit of an H100 / H200 block.
inline constexpr size_t kPrefetchGemmMaxSharedBytes = 227 * 1024;
// The shared memory ChoosePrefetchGemmConfig aims to stay within: two CTAs of this kernel plus a
// small kernel's CTA fit in an SM's 228 KiB.
inline constexpr size_t kPrefetchGemmCoResidentBytes = 111 * 1024;

// The largest k the norm inputs take: one 8-element vector per thread of the norm kernel's block
// (rms_norm.cu), whose reduction order the GEMM repeats.
inline constexpr int kPrefetchGemmMaxNormK = 8192;

enum class PrefetchGemmInput {
  kPlain,    // x [m, k]
  kSiluMul,  // x [m, 2k] = [gate | up]; the GEMM reads SiLU(gate)·up, rounded to bf16
  // The GEMM reads RMSNorm(x) * norm_weight, rounded to bf16: LaunchRmsNorm's bits (rms_norm.h).
  // residual_out, when set, receives x unchanged (CTA 0 writes it).
  kRmsNorm,
  // x is the delta added to the residual: h = bf16(x + residual_in) goes to residual_out (CTA 0
  // writes it; required), and the GEMM reads RMSNorm(h) * norm_weight, rounded to bf16:
  // LaunchFusedAddRmsNorm's bits (rms_norm.h).
  kAddRmsNorm,
};

struct PrefetchGemmArgs {
  const __nv_bfloat16* x = nullptr;  // [m, k], or [m, 2k] for kSiluMul
  const __nv_bfloat16* w = nullptr;  // [n, k]
  void* y = nullptr;                 // [m, n]
  int m = 0;
  int n = 0;
  int k = 0;
  PrefetchGemmInput input = PrefetchGemmInput::kPlain;
  bool float_output = false;  // y is float (logits), else bf16
  // W's first n / 2 rows are gate, the next n / 2 up: y [m, n / 2] receives SiLU(gate)·up,
  // rounded to bf16 as the SiLU·mul kernel does from the bf16 gate and up. A CTA then owns n / G
  // rows of W as before, half of them gate and half up. Needs the plain input, bf16 y, n even and
  // ctas ≤ n / 2.
  bool silu_mul_output = false;
  // The norm inputs only (kRmsNorm, kAddRmsNorm):
  const __nv_bfloat16* residual_in = nullptr;  // [m, k]: kAddRmsNorm's residual before the add
  // [m, k]: the residual after the add (kAddRmsNorm, required) or x (kRmsNorm, optional); must
  // not overlap x or residual_in, which every CTA reads while CTA 0 writes this.
  __nv_bfloat16* residual_out = nullptr;
  const __nv_bfloat16* norm_weight = nullptr;  // [k]
  float eps = 1e-5f;
};

struct PrefetchGemmConfig {
  int ctas = 0;    // CTAs (the grid); each owns n / ctas rows of W (± 1)
  int stages = 0;  // shared-memory ring stages of 16 rows × 1024 k (33 KiB each)
  // Each CTA's rows (at most 8) fill a stage as 8 rows × 2048 k: row r's first 1024 k in stage
  // row r, its next 1024 in row r + 8, and x's two k halves as MMA columns, so a stage carries
  // twice the weights it would with those rows alone (PrefetchGemmTakesRowHalves says where).
  bool row_halves = false;

  std::string ToString() const;  // "c264s2"
};

// Returns the configuration for the shape on a GPU of `sm_count` multiprocessors: `ctas_per_sm`
// CTAs per SM (at most n), and as many ring stages as a CTA's rows need, within `shared_budget`
// bytes when at least two fit there; else one CTA per SM within kPrefetchGemmMaxSharedBytes.
// stages is 0 when not even one stage fits beside the staged x. Two CTAs per SM (the default)
// measured faster in the 1B decode step on an H200 than one (runtime/model/NOTES.md).
PrefetchGemmConfig ChoosePrefetchGemmConfig(int m, int n, int k, int sm_count,
                                            int ctas_per_sm = 2,
                                            size_t shared_budget = kPrefetchGemmCoResidentBytes);

// Returns the dynamic shared memory of a launch: the staged x (m rows of k, padded), the
// reduction scratch, the ring and its barriers.
size_t PrefetchGemmSharedBytes(int m, int k, int stages);

// Returns whether the kernel runs the shape with `config` on the current device: compute
// capability 9.0 or later, 1 ≤ m ≤ kPrefetchGemmMaxRows, n ≥ 1, k a positive multiple of 8,
// 1 ≤ ctas ≤ n, 1 ≤ stages ≤ kPrefetchGemmMaxStages, and PrefetchGemmSharedBytes within
// kPrefetchGemmMaxSharedBytes.
bool PrefetchGemmSupportsShape(int m, int n, int k, const PrefetchGemmConfig& config);

// Returns whether the norm inputs (kRmsNorm, kAddRmsNorm) take this shape:
// PrefetchGemmSupportsShape and k ≤ kPrefetchGemmMaxNormK.
bool PrefetchGemmSupportsNormShape(int m, int n, int k, const PrefetchGemmConfig& config);

// Returns PrefetchGemmSupportsShape (PrefetchGemmSupportsNormShape for a norm input) for `args`
// and whether x, w, y and the norm input's buffers are set, 16-byte aligned and residual_out
// overlaps neither x nor residual_in, the norm's eps is not negative (nor NaN), and for the
// SiLU·mul output its conditions.
bool PrefetchGemmSupports(const PrefetchGemmArgs& args, const PrefetchGemmConfig& config);

// Raises the kernels' shared-memory limits (once per process; later calls return the first
// result). Call outside capture before capturing a launch; cudaSuccess and nothing done on a
// device without compute capability 9.0.
// Returns whether `row_halves` applies: no SiLU·mul output, m ≤ 4, k a multiple of 2048 and at
// most 8 rows of W per CTA (and, for PrefetchGemmSupports, the plain or SiLU·mul input).
bool PrefetchGemmTakesRowHalves(int m, int n, int k, int ctas, bool silu_mul_output);

cudaError_t PreparePrefetchGemm();

// Enqueues y = op(x) · Wᵀ on `stream` with programmatic dependent launch. Returns
// cudaErrorInvalidValue when PrefetchGemmSupports is false, else the launch's error.
cudaError_t LaunchPrefetchGemm(const PrefetchGemmArgs& args, const PrefetchGemmConfig& config,
                               cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_PREFETCH_GEMM_H_
