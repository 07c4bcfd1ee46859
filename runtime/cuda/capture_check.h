// Checks that kiln's own helpers run before any operation that is illegal during CUDA graph
// capture (a synchronize, a copy to or from pageable host memory, a pool growth), and the
// thread-local record of the first such operation that //graph:capture_guard reports.
//
//   absl::Status Stream::Synchronize() {
//     RETURN_IF_ERROR(CheckNotCapturing(stream_, "cudaStreamSynchronize"));
//     ...
//   }
//
// When the stream (or, in global capture mode, this thread) is capturing, CheckNotCapturing
// records the operation's name and returns FailedPrecondition naming it; the capture itself is
// left intact, so the caller's Status explains the failure instead of a later
// cudaErrorStreamCaptureInvalidated. Thread-safe: the record is per thread.
#ifndef KILN_RUNTIME_CUDA_CAPTURE_CHECK_H_
#define KILN_RUNTIME_CUDA_CAPTURE_CHECK_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Returns true if `stream` is capturing, or if this thread has a capture under way on any
// stream (global or thread-local capture mode forbids unsafe calls on every stream then). False
// when CUDA cannot answer for a reason other than a capture (no GPU, a sticky error): the
// operation the caller guards then reports that error itself.
bool IsCapturing(cudaStream_t stream);

// Returns FailedPrecondition naming `operation` when IsCapturing(stream), after recording it as
// this thread's first illegal operation (if none is recorded yet); else OK.
absl::Status CheckNotCapturing(cudaStream_t stream, absl::string_view operation);

// Records `operation` as this thread's first illegal operation during capture, if none is.
void RecordIllegalDuringCapture(absl::string_view operation);

// Returns and clears this thread's first recorded illegal operation ("" if none).
std::string TakeFirstIllegalDuringCapture();

// Marks the start and end of a capture on this thread; CaptureGuard calls these so that
// IsCapturing sees a capture on another stream of this thread. Nesting is not supported.
void NoteCaptureBegin(cudaStream_t stream);
void NoteCaptureEnd();

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_CAPTURE_CHECK_H_
