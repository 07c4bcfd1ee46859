#include "runtime/cuda/capture_check.h"

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

thread_local std::string first_illegal;
thread_local cudaStream_t capturing_stream = nullptr;
thread_local bool capture_noted = false;

}  // namespace

bool IsCapturing(cudaStream_t stream) {
  if (capture_noted) return true;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(stream, &status);
  if (error != cudaSuccess) {
    cudaGetLastError();
    // Asking about the legacy stream while another stream captures in global mode is itself
    // an error; treat it as capturing, which is what it means. Any other error (no GPU or
    // driver, a sticky error from an earlier kernel) says nothing about capture: the operation
    // itself then fails with it, instead of being blamed on a capture that does not exist.
    return error == cudaErrorStreamCaptureImplicit || error == cudaErrorStreamCaptureUnsupported ||
           error == cudaErrorStreamCaptureInvalidated;
  }
  return status != cudaStreamCaptureStatusNone;
}

absl::Status CheckNotCapturing(cudaStream_t stream, absl::string_view operation) {
  if (!IsCapturing(stream)) return absl::OkStatus();
  RecordIllegalDuringCapture(operation);
  return absl::FailedPreconditionError(
      absl::StrCat(operation,
                   " is illegal during CUDA graph capture; do it before the capture begins "
                   "or outside the captured function"));
}

void RecordIllegalDuringCapture(absl::string_view operation) {
  if (first_illegal.empty()) first_illegal = std::string(operation);
}

std::string TakeFirstIllegalDuringCapture() {
  std::string out;
  out.swap(first_illegal);
  return out;
}

void NoteCaptureBegin(cudaStream_t stream) {
  capturing_stream = stream;
  capture_noted = true;
}

void NoteCaptureEnd() {
  capturing_stream = nullptr;
  capture_noted = false;
}

}  // namespace kiln
