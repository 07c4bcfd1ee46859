#include "graph/capture_guard.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"

namespace kiln {
namespace {

std::string CudaErrorText(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
}

}  // namespace

void GraphDeleter::operator()(cudaGraph_t graph) const {
  if (graph != nullptr) cudaGraphDestroy(graph);
}

std::string DescribeCaptureError(cudaError_t error) {
  const char* meaning = nullptr;
  switch (error) {
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureUnsupported:
      meaning =
          "an operation that is illegal during capture ran on this thread (a raw cudaMalloc, "
          "cudaFree, cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize or a "
          "copy with pageable host memory) and invalidated the capture; move it before the "
          "capture, or call it through kiln's helpers, which refuse it by name";
      break;
    case cudaErrorStreamCaptureUnjoined:
      meaning =
          "work forked onto another stream during capture was not joined back into the capturing "
          "stream; record an event on the other stream and wait for it on the capturing stream "
          "before the capture ends";
      break;
    case cudaErrorStreamCaptureUnmatched:
      meaning = "the capture was ended on a stream other than the one it began on";
      break;
    case cudaErrorStreamCaptureWrongThread:
      meaning =
          "the capture was ended from a thread other than the one that began it "
          "(cudaStreamCaptureModeThreadLocal or Relaxed captures are per thread)";
      break;
    case cudaErrorStreamCaptureImplicit:
      meaning =
          "the legacy default stream was used during capture; launch on the capturing stream "
          "(kiln::Stream makes non-blocking streams)";
      break;
    case cudaErrorStreamCaptureIsolation:
      meaning =
          "a captured stream waited on an event recorded outside the capture; only events "
          "recorded in the same capture can be waited on";
      break;
    case cudaErrorCapturedEvent:
      meaning =
          "an event recorded during capture was queried or synchronized; wait on it with "
          "cudaStreamWaitEvent instead";
      break;
    case cudaErrorStreamCaptureMerge:
      meaning = "two independent captures were merged by a cross-stream dependency";
      break;
    default:
      break;
  }
  if (meaning == nullptr) return CudaErrorText(error);
  return absl::StrCat(cudaGetErrorName(error), ": ", meaning);
}

CaptureGuard::CaptureGuard(cudaStream_t stream, CaptureKey key, cudaStreamCaptureMode mode)
    : stream_(stream), key_(key) {
  // Forget a stale record (an illegal call refused outside any guard).
  TakeFirstIllegalDuringCapture();
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    begin_status_ = absl::InvalidArgumentError(
        absl::StrCat("Capture of ", KeyName(key),
                     " on the default stream; capture on a stream made by "
                     "kiln::Stream::Create"));
    return;
  }
  if (CaptureContext::IsCapturing()) {
    // A second capture on this thread would, when it ends, clear the first one's note for
    // capture_check (kiln's helpers would stop refusing) and take its recorded illegal call.
    begin_status_ = absl::FailedPreconditionError(absl::StrCat(
        "Capture of ", KeyName(key), " began while this thread captures ",
        KeyName(CaptureContext::Key()),
        "; nested captures are not supported: end that capture first"));
    return;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    begin_status_ = absl::FailedPreconditionError(
        absl::StrCat("Capture of ", KeyName(key),
                     " began on a stream that is already capturing; nested "
                     "captures are not supported"));
    return;
  }
  cudaGetLastError();  // a stale error must not be blamed on this capture
  const cudaError_t error = cudaStreamBeginCapture(stream, mode);
  if (error != cudaSuccess) {
    cudaGetLastError();
    begin_status_ = absl::FailedPreconditionError(absl::StrCat(
        "Capture of ", KeyName(key), " could not begin: ", DescribeCaptureError(error)));
    return;
  }
  capturing_ = true;
  NoteCaptureBegin(stream);
  phase_.emplace(CapturePhase::kCapture, key);
}

CaptureGuard::~CaptureGuard() {
  if (!capturing_) return;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  NoteCaptureEnd();
  TakeFirstIllegalDuringCapture();
  phase_.reset();
  capturing_ = false;
}

absl::StatusOr<OwnedGraph> CaptureGuard::End(absl::Status body_status) {
  if (!begin_status_.ok()) return begin_status_;
  if (ended_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Capture of ", KeyName(key_), " was already ended; call End once"));
  }
  ended_ = true;
  // The first error a call inside the capture left behind (a raw cudaMalloc returns
  // cudaErrorStreamCaptureUnsupported and invalidates the capture).
  const cudaError_t pending = cudaGetLastError();
  cudaGraph_t raw_graph = nullptr;
  const cudaError_t end_error = cudaStreamEndCapture(stream_, &raw_graph);
  OwnedGraph graph(raw_graph);
  cudaGetLastError();  // clear what ending an invalidated capture left, so the stream is usable
  NoteCaptureEnd();
  phase_.reset();
  capturing_ = false;
  const std::string illegal = TakeFirstIllegalDuringCapture();

  const std::string prefix = absl::StrCat("Capture of ", KeyName(key_), " failed: ");
  if (!illegal.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, illegal,
        " is illegal during CUDA graph capture; do it before the capture begins or outside the "
        "captured function"));
  }
  if (!body_status.ok()) {
    std::string message = absl::StrCat(prefix, body_status.message());
    if (end_error != cudaSuccess) {
      absl::StrAppend(&message, "; then the capture ended with ", DescribeCaptureError(end_error));
    }
    return absl::Status(body_status.code(), message);
  }
  if (end_error != cudaSuccess) {
    std::string message = absl::StrCat(prefix, DescribeCaptureError(end_error));
    if (pending != cudaSuccess && pending != end_error) {
      absl::StrAppend(&message, " (the first failing call inside the capture returned ",
                      CudaErrorText(pending), ")");
    }
    return absl::FailedPreconditionError(message);
  }
  if (pending == cudaErrorStreamCaptureUnsupported ||
      pending == cudaErrorStreamCaptureInvalidated) {
    // The capture survived, but without the refused call: the graph would not do what the
    // function asked.
    return absl::FailedPreconditionError(absl::StrCat(prefix, DescribeCaptureError(pending)));
  }
  if (pending != cudaSuccess) {
    return absl::InternalError(absl::StrCat(prefix, "a CUDA call inside the capture returned ",
                                            DescribeCaptureError(pending),
                                            "; check every call's result"));
  }
  if (graph == nullptr) {
    return absl::InternalError(absl::StrCat(prefix, "cudaStreamEndCapture returned no graph"));
  }
  return graph;
}

}  // namespace kiln
