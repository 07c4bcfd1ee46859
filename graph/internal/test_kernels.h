// Small kernels that the graph tests and graph_benchmark capture and replay. Each launcher
// returns the launch's cudaError_t (checked by the caller); all are legal during capture.
#ifndef KILN_GRAPH_INTERNAL_TEST_KERNELS_H_
#define KILN_GRAPH_INTERNAL_TEST_KERNELS_H_

#include <cuda_runtime_api.h>

namespace kiln {
namespace graph_internal {

// tmp[i] = a * x[i] + b, for i < n.                        // x, tmp: [n]
cudaError_t LaunchAffine(const float* x, float* tmp, int n, float a, float b,
                         cudaStream_t stream);

// y[i] = tmp[i] * tmp[i] + x[i], for i < n.                 // tmp, x, y: [n]
cudaError_t LaunchSquareAdd(const float* tmp, const float* x, float* y, int n,
                            cudaStream_t stream);

// y[i] = value, for i < n.
cudaError_t LaunchFill(float* y, int n, float value, cudaStream_t stream);

// Rows of 64 per block, `num_tiles` blocks: y[r] = 2 * x[r] + 1 for r < *num_rows (read from
// device memory at run time), y[r] = 0 for the other rows the grid covers. The grid is the
// caller's choice: from the key (replays right for any *num_rows up to the key) or from the batch
// contents at launch (freezes the batch into a captured graph).
constexpr int kRowsPerTile = 64;
cudaError_t LaunchTiles(const float* x, float* y, const int* num_rows, int num_tiles,
                        cudaStream_t stream);

// One block of 32 threads: x[threadIdx.x] += 1. The smallest kernel a chain can hold.
cudaError_t LaunchTick(float* x, cudaStream_t stream);

// LaunchTick with programmatic dependent launch: the next kernel in the stream may start
// launching while this one runs, and waits (griddepcontrol.wait) for it before touching memory.
// Needs compute capability 9.0.
cudaError_t LaunchTickPdl(float* x, cudaStream_t stream);

}  // namespace graph_internal
}  // namespace kiln

#endif  // KILN_GRAPH_INTERNAL_TEST_KERNELS_H_
