// RAII CUDA graph capture on one stream, whose End() explains a failure in words.
//
//   absl::StatusOr<kiln::OwnedGraph> CaptureStep(cudaStream_t stream) {
//     kiln::CaptureGuard guard(stream, {kiln::GraphMode::kDecode, 8});   // begins capture
//     absl::Status body = guard.ok() ? RunStep(stream) : absl::OkStatus();
//     return guard.End(body);   // the graph, or why there is none
//   }
//
// States: begun ──End()──► ended (graph returned or failure explained)
//         begun ──destructor──► ended (partial graph destroyed, errors cleared)
//         begin failed ──End()──► the begin error
// While begun, CaptureContext::Phase() is kCapture with the guard's key, and
// runtime/cuda/capture_check sees this thread as capturing, so kiln's own helpers refuse what
// would break the capture (Stream::Synchronize, copies with pageable host memory,
// DeviceBuffer::Allocate, graph pool growth) and record the first one.
//
// End() reports, in this order: the first illegal operation a kiln helper refused (by name);
// else the body's error (e.g. a raw cudaMalloc's status from CUDA_RETURN_IF_ERROR, which names
// the call); else the CUDA error that ended the capture, translated into what to do
// (cudaErrorStreamCaptureInvalidated, ...Unsupported, ...Unjoined, ...). In every case the
// capture is ended, the partial graph destroyed and the sticky last error cleared, so the stream
// is usable and the next capture works.
//
// The default capture mode is cudaStreamCaptureModeGlobal: unsafe calls from this thread (and
// other threads' global-mode calls) fail fast instead of silently breaking the graph.
// A guard belongs to the thread that made it (capture state is per thread). Not copyable or
// movable. Nesting captures is not supported: a guard made while this thread captures (its
// CaptureContext phase is kCapture) does not begin (FailedPrecondition naming both keys).
#ifndef KILN_GRAPH_CAPTURE_GUARD_H_
#define KILN_GRAPH_CAPTURE_GUARD_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/capture_context.h"

namespace kiln {

// Destroys a cudaGraph_t.
struct GraphDeleter {
  void operator()(cudaGraph_t graph) const;
};

// Owns a captured (not yet instantiated) CUDA graph.
using OwnedGraph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;

class CaptureGuard {
 public:
  // Begins capturing `stream` (which must not be the legacy default stream) for `key` in
  // `mode`. Check ok() before running the body; a failed begin changes nothing.
  CaptureGuard(cudaStream_t stream, CaptureKey key,
               cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal);

  // Ends an unfinished capture cleanly: ends it, destroys the partial graph, clears the
  // recorded illegal operation and CUDA's last error, and restores the capture phase.
  ~CaptureGuard();

  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;

  // Returns true if the capture began.
  bool ok() const { return begin_status_.ok(); }
  // Returns why the capture did not begin (OK if it did).
  const absl::Status& begin_status() const { return begin_status_; }
  // Returns true until End() (or the destructor) ends a begun capture.
  bool capturing() const { return capturing_; }

  // Ends the capture and returns the graph (owned by the caller), or a Status naming the key and
  // explaining the failure (see the file comment). `body_status` is the captured function's
  // result; a non-OK one fails the capture. Call at most once.
  absl::StatusOr<OwnedGraph> End(absl::Status body_status = absl::OkStatus());

 private:
  cudaStream_t stream_;
  CaptureKey key_;
  absl::Status begin_status_;
  bool capturing_ = false;
  bool ended_ = false;
  std::optional<CaptureContext::Scope> phase_;
};

// Returns an explanation of a CUDA error met while capturing (what it means and the fix), e.g.
// for cudaErrorStreamCaptureInvalidated. Falls back to CUDA's own name and description.
std::string DescribeCaptureError(cudaError_t error);

}  // namespace kiln

#endif  // KILN_GRAPH_CAPTURE_GUARD_H_
