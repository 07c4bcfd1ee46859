// y = op(x) · Wᵀ for the few rows of a decode step (m ≤ 8), with the weights bulk-copied into
// shared memory before the kernel waits for the one before it: x [m, k] bf16, W [n, k] bf16
// (PyTorch's Linear layout), y [m, n] bf16 or float, float accumulation. op is the identity, or
// SiLU(gate)·up for the down projection, whose x is then the gate-up projection's output [m, 2k]
// (gate first), so the SiLU·mul kernel drops out of the step (slower in a decode step than that
// kernel followed by a plain launch: runtime/model/NOTES.md).
//
//   kiln::PrefetchGemmConfig config = kiln::ChoosePrefetchGemmConfig(m, n, k, sm_count);
//   kiln::PrefetchGemmArgs args{x, w, y, m, n, k};
//   if (kiln::PrefetchGemmSupports(args, config)) {
//     CUDA_RETURN_IF_ERROR(kiln::LaunchPrefetchGemm(args, config, stream));
//   }
//
// Why: at m ≤ 8 a projection's time is its weight bytes over memory bandwidth plus what it costs
// to start and finish. The weights do not depend on the kernel before, only x does. Each CTA
// owns a contiguous range of W's rows, which it streams through a ring of shared-memory stages
// (16 rows × 1024 k each) with the bulk-copy engine (cp.async.bulk, completing on an mbarrier).
// Launched with programmatic dependent launch, the CTAs become resident while the kernels before
// them still run and fill the ring (up to ~100 KiB per CTA) before griddepcontrol.wait; only then
// do they read x (one bulk copy per row, or through SiLU·mul where asked), multiply on the tensor
// cores (mma.m16n8k16, x padded to 8 rows) and write y. ChoosePrefetchGemmConfig sizes the ring
// so that two CTAs fit on one SM: two of this projection by default; with one CTA per SM, the
// next projection's CTAs fit beside this one's and prefetch while it streams, which measured
// slower in a decode step (runtime/model/NOTES.md, with the per-projection figures).
//
// Every sum has a fixed order (k in stage order, then the 8 warps in warp order), so y is bitwise
// reproducible for a given (m, n, k, config): an eager run and a graph agree bit for bit. Needs
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

enum class PrefetchGemmInput {
  kPlain,    // x [m, k]
  kSiluMul,  // x [m, 2k] = [gate | up]; the GEMM reads SiLU(gate)·up, rounded to bf16
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
};

struct PrefetchGemmConfig {
  int ctas = 0;    // CTAs (the grid); each owns n / ctas rows of W (± 1)
  int stages = 0;  // shared-memory ring stages of 16 rows × 1024 k (33 KiB each)

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

// Returns PrefetchGemmSupportsShape for `args` and whether x, w and y are 16-byte aligned.
bool PrefetchGemmSupports(const PrefetchGemmArgs& args, const PrefetchGemmConfig& config);

// Raises the kernels' shared-memory limits (once per process; later calls return the first
// result). Call outside capture before capturing a launch; cudaSuccess and nothing done on a
// device without compute capability 9.0.
cudaError_t PreparePrefetchGemm();

// Enqueues y = op(x) · Wᵀ on `stream` with programmatic dependent launch. Returns
// cudaErrorInvalidValue when PrefetchGemmSupports is false, else the launch's error.
cudaError_t LaunchPrefetchGemm(const PrefetchGemmArgs& args, const PrefetchGemmConfig& config,
                               cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_PREFETCH_GEMM_H_
