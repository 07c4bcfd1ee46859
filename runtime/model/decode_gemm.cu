#include "runtime/model/decode_gemm.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "runtime/model/internal/decode_gemm_kernel.cuh"

namespace kiln {
namespace internal {

// Defined in decode_gemm_m8.cu, decode_gemm_m16.cu and decode_gemm_m32.cu.
extern template cudaError_t LaunchDecodeGemmTiles<1>(const DecodeGemmParams&, int, bool, bool,
                                                     cudaStream_t);
extern template cudaError_t LaunchDecodeGemmTiles<2>(const DecodeGemmParams&, int, bool, bool,
                                                     cudaStream_t);
extern template cudaError_t LaunchDecodeGemmTiles<4>(const DecodeGemmParams&, int, bool, bool,
                                                     cudaStream_t);

}  // namespace internal

namespace {

// x tiles of 8 rows the kernel is built for: 8, 16 or 32 rows of x.
int XTiles(int m) { return m <= 8 ? 1 : (m <= 16 ? 2 : 4); }

bool ValidRowWarps(int r) { return r == 1 || r == 2 || r == 4; }
bool ValidSplits(int s) { return s == 1 || s == 2 || s == 4 || s == 8; }

// Fewer CTAs than this many per SM leave too little of W in flight: split k. (1B shapes on an
// H200, runtime/runner/NOTES.md: the fastest configurations ran 190–512 CTAs on 132 SMs.)
constexpr double kFillFraction = 1.45;
// A staged x slice above this takes long to load before the first MMA (and limits the CTAs per
// SM): split k, as long as the partial sums stay below kMaxSplitWorkspaceBytes.
constexpr size_t kPreferredSharedBytes = 64 * 1024;
constexpr size_t kMaxSplitWorkspaceBytes = 8 << 20;

}  // namespace

std::string DecodeGemmConfig::ToString() const {
  return "r" + std::to_string(row_warps) + "s" + std::to_string(splits);
}

DecodeGemmConfig ChooseDecodeGemmConfig(int m, int n, int k, int sm_count) {
  DecodeGemmConfig c;
  // More row warps share each staged x: worth it for long rows (fewer, longer CTAs), for many
  // rows of x, and for tall W.
  c.row_warps = (k >= 4096 || m > 8) ? 4 : (n >= 8192 ? 2 : 1);
  const int rows = 16 * c.row_warps;
  const int64_t tiles = (int64_t{n} + rows - 1) / rows;
  auto staged = [&](int splits) {
    return internal::DecodeGemmSharedBytes(m, k / splits, XTiles(m));
  };
  // Split while the next split still divides k into whole groups and the tiles leave SMs idle,
  // the staged x does not fit, or it is large and splitting is cheap.
  auto workspace = [&](int splits) {
    return static_cast<size_t>(splits) * m * static_cast<size_t>(n) * sizeof(float);
  };
  while (c.splits < 8 && k % (2 * 128 * c.splits) == 0 &&
         (tiles * c.splits < kFillFraction * sm_count ||
          staged(c.splits) > kDecodeGemmMaxSharedBytes ||
          (staged(c.splits) > kPreferredSharedBytes &&
           workspace(2 * c.splits) <= kMaxSplitWorkspaceBytes))) {
    c.splits *= 2;
  }
  return c;
}

bool DecodeGemmSupportsShape(int m, int n, int k, DecodeGemmInput input, bool float_output,
                             const DecodeGemmConfig& c) {
  if (m < 1 || m > kDecodeGemmMaxRows || n < 16 || n % 16 != 0 || k < 128) return false;
  if (!ValidRowWarps(c.row_warps) || !ValidSplits(c.splits)) return false;
  if (k % (128 * c.splits) != 0) return false;
  if (internal::DecodeGemmSharedBytes(m, k / c.splits, XTiles(m)) > kDecodeGemmMaxSharedBytes) {
    return false;
  }
  return !(input == DecodeGemmInput::kSiluMul && float_output);
}

bool DecodeGemmSupports(const DecodeGemmArgs& a, const DecodeGemmConfig& c) {
  return DecodeGemmSupportsShape(a.m, a.n, a.k, a.input, a.float_output, c) &&
         a.x != nullptr && a.w != nullptr && a.y != nullptr && internal::Aligned16(a.x) &&
         internal::Aligned16(a.w) && internal::Aligned16(a.y);
}

size_t DecodeGemmWorkspaceBytes(int m, int n, const DecodeGemmConfig& c) {
  if (c.splits <= 1) return 0;
  return static_cast<size_t>(c.splits) * m * n * sizeof(float);
}

int DecodeGemmCounters(int n, const DecodeGemmConfig& c) {
  if (c.splits <= 1) return 0;
  const int rows = 16 * c.row_warps;
  return (n + rows - 1) / rows;
}

cudaError_t LaunchDecodeGemm(const DecodeGemmArgs& a, const DecodeGemmConfig& c,
                             float* workspace, int32_t* counters, cudaStream_t stream) {
  if (!DecodeGemmSupports(a, c)) return cudaErrorInvalidValue;
  if (c.splits > 1 && (workspace == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  internal::DecodeGemmParams p;
  p.x = a.x;
  p.w = a.w;
  p.y = a.y;
  p.partials = workspace;
  p.counters = counters;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.x_stride = a.input == DecodeGemmInput::kSiluMul ? 2 * int64_t{a.k} : a.k;
  p.k_split = a.k / c.splits;
  p.splits = c.splits;
  const bool silu = a.input == DecodeGemmInput::kSiluMul;
  switch (XTiles(a.m)) {
    case 1:
      return internal::LaunchDecodeGemmTiles<1>(p, c.row_warps, silu, a.float_output, stream);
    case 2:
      return internal::LaunchDecodeGemmTiles<2>(p, c.row_warps, silu, a.float_output, stream);
    default:
      return internal::LaunchDecodeGemmTiles<4>(p, c.row_warps, silu, a.float_output, stream);
  }
}

}  // namespace kiln
