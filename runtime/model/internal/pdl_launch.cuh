// Programmatic dependent launch (PDL) for //runtime/model's kernels: every kernel of a decode
// step is launched with cudaLaunchAttributeProgrammaticStreamSerialization, calls
// AllowDependentLaunch() (runtime/cuda/device_helpers.cuh) at its start, and
// WaitForPrerequisites() before it touches anything an earlier kernel of the step writes. The
// next kernel is then already resident while this one runs, and runs its independent prologue (a
// GEMM streams its first weights, the RoPE kernel builds its cos/sin table) before the wait.
//
// The rules every kernel launched this way keeps:
//   - before the wait it reads only memory no kernel of the step writes (weights, and step
//     metadata a copy uploaded before the step's first kernel) and writes nothing;
//   - every CTA waits (also one that has nothing to do), so the kernel completes only after the
//     one before it: completion stays transitive along the stream, and a kernel waiting for its
//     predecessor also waits for everything earlier.
// Included by .cu files only.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_PDL_LAUNCH_CUH_
#define KILN_RUNTIME_MODEL_INTERNAL_PDL_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda/compute_capability.h"

namespace kiln {
namespace internal {

// Returns whether the current device runs programmatic dependent launches (compute capability
// 9.0 or later). Asked once per process: kiln runs on one kind of GPU at a time.
inline bool SupportsProgrammaticLaunch() { return CurrentDeviceIsSm90OrLater(); }

// Enqueues `kernel` on `stream` with programmatic dependent launch where the GPU supports it
// (an ordinary launch elsewhere), its CTAs grouped into clusters of `cluster_x` along x when
// cluster_x > 1 (sm_90+ only: the caller asks for clusters only where
// SupportsProgrammaticLaunch()). Returns the launch's error. Callable during capture.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchWithPdlInClusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                    unsigned cluster_x, size_t shared_bytes, cudaStream_t stream,
                                    Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (SupportsProgrammaticLaunch()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_x > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = cluster_x;
    attribute[count].val.clusterDim.y = 1;
    attribute[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Lets `kernel` take up to `dynamic_bytes` of dynamic shared memory and asks for the largest
// shared-memory share of each SM, so that a CTA of it finds room beside another kernel's. Call
// outside capture. Returns the first error.
template <typename... KernelArgs>
cudaError_t AllowSharedMemory(void (*kernel)(KernelArgs...), size_t dynamic_bytes) {
  const cudaError_t e = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_bytes));
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

// The same without clusters.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchWithPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                          size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  return LaunchWithPdlInClusters(kernel, grid, block, 1, shared_bytes, stream,
                                 std::forward<Args>(args)...);
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_PDL_LAUNCH_CUH_
