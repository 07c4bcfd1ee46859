// y = op(x) · Wᵀ for the few rows of a decode step (m ≤ 32), on the tensor cores, reading W once
// at close to the memory bandwidth: x [m, k] bf16, W [n, k] bf16 (PyTorch's Linear layout),
// y [m, n] bf16 or float, float accumulation. op is the identity, or SiLU(gate)·up for the down
// projection, whose x is then the gate-up projection's output [m, 2k] (gate first), so the
// SiLU·mul kernel and its activation buffer drop out of the step.
//
//   kiln::DecodeGemmConfig config = kiln::ChooseDecodeGemmConfig(m, n, k, sm_count);
//   // workspace: DecodeGemmWorkspaceBytes(m, n, config) bytes; counters: DecodeGemmCounters(n,
//   // config) int32, zeroed once (FillDeviceAndWait) and kept zero by the kernel between launches.
//   kiln::DecodeGemmArgs args{x, w, y, m, n, k};
//   if (kiln::DecodeGemmSupports(args, config)) {
//     CUDA_RETURN_IF_ERROR(kiln::LaunchDecodeGemm(args, config, workspace, counters, stream));
//   }
//
// Why: at m ≤ 32 a projection is bound by its weight bytes, and its time is short (2–20 µs for a
// 1B model), so what matters is every SM streaming W from the start. cuBLASLt picks no split-K
// for the small projections and reaches 1.4–2 TB/s there (runtime/model/NOTES.md); the skinny
// kernel re-reads x per row and is L1-bound from 4 rows. Here a CTA of 8 warps owns 16·R rows of
// W and a slice of k; its warps load W with 16-byte loads laid out as mma.m16n8k16 fragments
// (no shared-memory staging of W), keep 8 KiB per warp in flight, and read x from shared memory,
// staged once per CTA. The first weights are loaded before griddepcontrol.wait: launched with
// programmatic dependent launch, the GEMM streams its weights while the kernel before it
// finishes (internal/pdl_launch.cuh).
//
// Config: row_warps R (1, 2, 4: rows per CTA 16·R; more rows share the staged x, which matters
// from 16 rows of x on) and splits S (CTAs that divide k; their float partial sums meet in the
// workspace, and the last CTA of a row tile adds them in split order). ChooseDecodeGemmConfig
// picks them from the shape and the SM count; every choice depends only on (m, n, k), so an
// eager run and a graph of the same shape compute the same bits, and so do two runs.
//
// Callable during capture once each kernel configuration has been launched eagerly (the first
// launch raises its shared-memory limit); thread-safe as long as concurrent launches use
// different workspaces and counters.
#ifndef KILN_RUNTIME_MODEL_DECODE_GEMM_H_
#define KILN_RUNTIME_MODEL_DECODE_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// The most rows of x the kernel takes.
inline constexpr int kDecodeGemmMaxRows = 32;
// The most dynamic shared memory a configuration may use (the staged x slice).
inline constexpr size_t kDecodeGemmMaxSharedBytes = 144 * 1024;

enum class DecodeGemmInput {
  kPlain,    // x [m, k]
  kSiluMul,  // x [m, 2k] = [gate | up]; the GEMM reads SiLU(gate)·up, rounded to bf16
};

struct DecodeGemmArgs {
  const __nv_bfloat16* x = nullptr;  // [m, k], or [m, 2k] for kSiluMul
  const __nv_bfloat16* w = nullptr;  // [n, k]
  void* y = nullptr;                 // [m, n]
  int m = 0;
  int n = 0;
  int k = 0;
  DecodeGemmInput input = DecodeGemmInput::kPlain;
  bool float_output = false;  // y is float (logits), else bf16; kSiluMul needs bf16
};

struct DecodeGemmConfig {
  int row_warps = 1;  // 1, 2 or 4
  int splits = 1;     // 1, 2, 4 or 8; k must be a multiple of 128 · splits

  std::string ToString() const;  // "r1s2"
};

// Returns the configuration for the shape on a GPU of `sm_count` multiprocessors: 4 row warps
// for k ≥ 4096 or m > 8, else 2 for n ≥ 8192, else 1; then the fewest splits that give about
// 1.45 CTAs per SM and keep the staged x within the shared-memory limit (and, where the partial
// sums stay small, within 64 KiB). Tuned on the 1B shapes on an H200 (runtime/runner/NOTES.md).
DecodeGemmConfig ChooseDecodeGemmConfig(int m, int n, int k, int sm_count);

// Returns whether the kernel runs the shape with `config`: 1 ≤ m ≤ kDecodeGemmMaxRows, n a
// positive multiple of 16, k a positive multiple of 128 · splits, a staged x slice within
// kDecodeGemmMaxSharedBytes, bf16 output for kSiluMul.
bool DecodeGemmSupportsShape(int m, int n, int k, DecodeGemmInput input, bool float_output,
                             const DecodeGemmConfig& config);

// Returns DecodeGemmSupportsShape for `args` and whether x, w and y are 16-byte aligned.
bool DecodeGemmSupports(const DecodeGemmArgs& args, const DecodeGemmConfig& config);

// Returns the float workspace bytes a launch needs (0 without splits): splits · m · n floats.
size_t DecodeGemmWorkspaceBytes(int m, int n, const DecodeGemmConfig& config);

// Returns the int32 counters a launch needs (0 without splits): one per tile of 16·R rows.
int DecodeGemmCounters(int n, const DecodeGemmConfig& config);

// Enqueues y = op(x) · Wᵀ on `stream` with programmatic dependent launch. `workspace` and
// `counters` (zero before the first launch; the kernel leaves them zero) are needed only with
// splits; they may be shared by launches on one stream. Returns cudaErrorInvalidValue when
// DecodeGemmSupports is false or a needed buffer is null, else the launch's error.
cudaError_t LaunchDecodeGemm(const DecodeGemmArgs& args, const DecodeGemmConfig& config,
                             float* workspace, int32_t* counters, cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_DECODE_GEMM_H_
