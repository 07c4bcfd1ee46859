// The first kernel of every step: copies the step's metadata blob (token ids, positions, the
// attention plan, the block table; step_plan.h) from pinned host memory into device memory over
// PCIe, inside the step's own kernel sequence.
//
//   const kiln::MetadataFetch fetch = layout.Fetch();
//   CUDA_RETURN_IF_ERROR(kiln::LaunchFetchStepMetadata(pinned_blob, device_blob, fetch, stream));
//   // ... the step's kernels, which read device_blob
//
// Why: a cudaMemcpyAsync before the step is an operation of the copy engine, which the stream
// orders against the step's kernels with a hand-off each way; a kernel that reads the pinned blob
// itself costs one read over PCIe (three when the block table is large: MetadataFetch). It can
// be captured in the step's graph, where it reads whatever the host wrote into the blob before
// the replay. It is launched without programmatic dependent launch, so it starts after
// everything before it on the stream, and it never lets the next kernel launch early: the step's
// kernels read the metadata in their prologues, before their waits (the RoPE kernel its
// positions and KV slots, attention its work items), and with each kernel letting the next one
// in at its start, a chain of early launches would reach them while this kernel still writes.
// The next kernel launches when this one has completed. The host must not rewrite the blob until
// the stream has passed the kernel (the Runner synchronizes after every step). The launch shape
// depends only on `fetch`. Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_RUNNER_STEP_FETCH_H_
#define KILN_RUNTIME_RUNNER_STEP_FETCH_H_

#include <cuda_runtime_api.h>

#include "runtime/runner/step_plan.h"

namespace kiln {

// Copies `fetch`'s bytes of `host` (pinned: cudaMallocHost or cudaHostAlloc) to `device`.
// cudaErrorInvalidValue for a null pointer, pointers or a table offset not 16-byte aligned, sizes
// or offsets not multiples of 4, or row_bytes > 0 with max_rows < 1.
cudaError_t LaunchFetchStepMetadata(const void* host, void* device, const MetadataFetch& fetch,
                                    cudaStream_t stream);

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_STEP_FETCH_H_
