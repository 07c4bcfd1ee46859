// y = x · Wᵀ for the tens of rows of a decode step of a moderate batch (m ≤ 64) on Hopper's
// asynchronous tensor cores, with the weights copied into shared memory before the kernel waits
// for the one before it: x [m, k] bf16, W [n, k] bf16 (PyTorch's Linear layout), y [m, n] bf16,
// float accumulation.
//
//   kiln::TmaGemmConfig config = kiln::ChooseTmaGemmConfig(m, n, k, sm_count);
//   kiln::TmaGemmArgs args{x, w, y, m, n, k};
//   if (kiln::TmaGemmSupports(args, config)) {
//     CUDA_RETURN_IF_ERROR(kiln::LaunchTmaGemm(args, config, stream));
//   }
//
// Why: from 9 rows the prefetch GEMM (prefetch_gemm.h) is latency-bound (every CTA stages all of
// x and feeds mma.sync through registers), and cuBLASLt's kernels start reading their weights
// only after the kernel before them has ended: a small projection (QKV, O: 8–13 MB) then streams
// at 1.4–2.0 TB/s. Here each CTA owns a tile of 64 rows of W and a slice of k, copies them in
// 64 × 64 pieces with the tensor memory accelerator (cp.async.bulk.tensor, 128-byte swizzle) into
// a ring of shared-memory stages, issuing the whole ring before griddepcontrol.wait; after the
// wait the matching x pieces (its m rows, zero-filled up to 16, 32 or 64) follow into the same
// stages, and one warpgroup multiplies each stage with wgmma (W as the 64-row A operand, x as
// the B operand, both read from shared memory). The CTAs of a tile's k slices form one cluster
// and add up their partial tiles through distributed shared memory, each rank a share of the
// tile's elements, in slice order. Launched with programmatic dependent launch.
//
// Every sum has a fixed order (k in stage order within a slice, then the slices in order), so y
// is bitwise reproducible for a given (m, n, k, config): an eager run and a graph agree bit for
// bit. Needs compute capability 9.0 (TmaGemmSupports is false elsewhere). The tensor maps are
// encoded at each launch through the driver's cuTensorMapEncodeTiled (reached through the
// runtime: kiln never links libcuda). Callable during capture once PrepareTmaGemm has run (or
// any launch ran eagerly); thread-safe.
#ifndef KILN_RUNTIME_MODEL_TMA_GEMM_H_
#define KILN_RUNTIME_MODEL_TMA_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// The most rows of x the kernel takes (the largest wgmma N it is built for).
inline constexpr int kTmaGemmMaxRows = 64;
// Rows of W per CTA tile (the wgmma M) and k per stage (one 128-byte swizzle row of bf16).
inline constexpr int kTmaGemmTileRows = 64;
inline constexpr int kTmaGemmStageK = 64;
// The most ring stages and k slices a configuration may have (the slices of a tile are one
// cluster: at most the portable cluster size).
inline constexpr int kTmaGemmMaxStages = 16;
inline constexpr int kTmaGemmMaxSplits = 8;
// The most dynamic shared memory a CTA may use: the opt-in limit of an H100 / H200 block (227
// KiB) less 1 KiB for the kernel's static shared memory (its barriers).
inline constexpr size_t kTmaGemmMaxSharedBytes = 226 * 1024;
// The shared memory ChooseTmaGemmConfig aims to stay within at two CTAs per SM: with one k slice
// the co-resident budget; with several (a cluster per tile) less, so that three CTAs fit on an SM
// and a GPC finds room for whole clusters.
inline constexpr size_t kTmaGemmCoResidentBytes = 112 * 1024;
inline constexpr size_t kTmaGemmClusterBytes = 72 * 1024;

struct TmaGemmArgs {
  const __nv_bfloat16* x = nullptr;  // [m, k]
  const __nv_bfloat16* w = nullptr;  // [n, k]
  __nv_bfloat16* y = nullptr;        // [m, n]
  int m = 0;
  int n = 0;
  int k = 0;
  // When the next kernel on the stream may launch (programmatic dependent launch): false, at
  // this kernel's start, so that its own prologue overlaps this one (a GEMM streams its weights);
  // true, only once this kernel's wait has returned. Give true where the kernels that follow read
  // everything after their waits and would only crowd the SMs while this one streams: on an H200
  // (1B decode step, QKV projection, then RoPE + KV append and attention) batch 32 went from
  // 1.327-1.335 to 1.311-1.317 ms, and from 1.401-1.410 to 1.301-1.305 after a step of 8 rows
  // (runtime/runner/NOTES.md, "Batch 32 in two modes").
  bool next_after_wait = false;
  // y = SiLU(gate)·up [m, n / 2] instead of the product, for a fused gate-up projection: W's first
  // n / 2 rows are the gate projection's, the rest the up projection's. Each element is
  // bf16(SiLU(g)·u) of the products g and u rounded to bf16: the bits of the plain GEMM followed
  // by the SiLU·mul kernel (silu_mul.h), without that kernel. n must be even; the configuration
  // and grid are those of the plain GEMM of the same shape (each tile then takes 32 gate rows and
  // their 32 up rows).
  bool silu_mul = false;
};

struct TmaGemmConfig {
  int splits = 0;  // k slices per tile of 64 rows of W: the grid is ceil(n / 64) · splits CTAs
  int stages = 0;  // shared-memory ring stages (64 rows of W and the x rows, 64 k each)

  std::string ToString() const;  // "k5s7"
};

// Returns the rows of x a launch of m rows computes: m rounded up to 16, 32 or 64 (the wgmma N).
int TmaGemmPaddedRows(int m);

// Returns the configuration for the shape on a GPU of `sm_count` multiprocessors: as many k
// slices as keep the grid within `ctas_per_sm` CTAs per SM (at least 1, at most the 64-k pieces
// of k and `max_splits`), and as many ring stages as a slice needs within
// kTmaGemmCoResidentBytes (two CTAs per SM) or kTmaGemmMaxSharedBytes (one). stages is 0 for a
// shape the kernel does not take and for max_splits outside [1, kTmaGemmMaxSplits].
TmaGemmConfig ChooseTmaGemmConfig(int m, int n, int k, int sm_count, int ctas_per_sm = 2,
                                  int max_splits = kTmaGemmMaxSplits);

// Returns the dynamic shared memory of a launch of m rows with `stages` ring stages.
size_t TmaGemmSharedBytes(int m, int stages);

// Returns whether the kernel runs the shape with `config` on the current device: compute
// capability 9.0 or later, 1 ≤ m ≤ kTmaGemmMaxRows, n ≥ 1, k a positive multiple of 8,
// 1 ≤ splits ≤ min(kTmaGemmMaxSplits, the 64-k pieces of k), 1 ≤ stages ≤ kTmaGemmMaxStages,
// and TmaGemmSharedBytes within kTmaGemmMaxSharedBytes.
bool TmaGemmSupportsShape(int m, int n, int k, const TmaGemmConfig& config);

// Returns TmaGemmSupportsShape for `args`, whether n is even with silu_mul, and whether x, w and y
// are set and 16-byte aligned.
bool TmaGemmSupports(const TmaGemmArgs& args, const TmaGemmConfig& config);

// Raises the kernels' shared-memory limits and finds cuTensorMapEncodeTiled (once per process;
// later calls return the first result). Call outside capture before capturing a launch;
// cudaSuccess and nothing done on a device without compute capability 9.0.
cudaError_t PrepareTmaGemm();

// Enqueues y = x · Wᵀ on `stream` with programmatic dependent launch, the k slices of a tile in
// one cluster. Returns cudaErrorInvalidValue when TmaGemmSupports is false or a tensor map cannot
// be encoded, else the launch's error.
cudaError_t LaunchTmaGemm(const TmaGemmArgs& args, const TmaGemmConfig& config,
                          cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_TMA_GEMM_H_
