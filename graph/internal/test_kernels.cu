#include "graph/internal/test_kernels.h"

namespace kiln {
namespace graph_internal {
namespace {

constexpr int kThreads = 256;

int Blocks(int n) { return (n + kThreads - 1) / kThreads; }

__global__ void AffineKernel(const float* __restrict__ x, float* __restrict__ tmp, int n,
                             float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = a * x[i] + b;
}

__global__ void SquareAddKernel(const float* __restrict__ tmp, const float* __restrict__ x,
                                float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = tmp[i] * tmp[i] + x[i];
}

__global__ void FillKernel(float* __restrict__ y, int n, float value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = value;
}

__global__ void TilesKernel(const float* __restrict__ x, float* __restrict__ y,
                            const int* __restrict__ num_rows) {
  const int r = blockIdx.x * kRowsPerTile + threadIdx.x;
  y[r] = r < *num_rows ? 2.0f * x[r] + 1.0f : 0.0f;
}

__global__ void TickKernel(float* x) { x[threadIdx.x] += 1.0f; }

__global__ void TickPdlKernel(float* x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the next kernel begin launching at once: it still waits below, in its own
  // griddepcontrol.wait, until this whole grid has finished and its writes are visible.
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  x[threadIdx.x] += 1.0f;
#else
  x[threadIdx.x] += 1.0f;
#endif
}

}  // namespace

cudaError_t LaunchAffine(const float* x, float* tmp, int n, float a, float b,
                         cudaStream_t stream) {
  AffineKernel<<<Blocks(n), kThreads, 0, stream>>>(x, tmp, n, a, b);
  return cudaGetLastError();
}

cudaError_t LaunchSquareAdd(const float* tmp, const float* x, float* y, int n,
                            cudaStream_t stream) {
  SquareAddKernel<<<Blocks(n), kThreads, 0, stream>>>(tmp, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* y, int n, float value, cudaStream_t stream) {
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(y, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchTiles(const float* x, float* y, const int* num_rows, int num_tiles,
                        cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  TilesKernel<<<num_tiles, kRowsPerTile, 0, stream>>>(x, y, num_rows);
  return cudaGetLastError();
}

cudaError_t LaunchTick(float* x, cudaStream_t stream) {
  TickKernel<<<1, 32, 0, stream>>>(x);
  return cudaGetLastError();
}

cudaError_t LaunchTickPdl(float* x, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, TickPdlKernel, x);
}

}  // namespace graph_internal
}  // namespace kiln
