#include "runtime/cuda/event.h"

#include <utility>

#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::StatusOr<Event> Event::Create(Kind kind) {
  cudaEvent_t event = nullptr;
  unsigned flags = kind == kTiming ? cudaEventDefault : cudaEventDisableTiming;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, flags));
  return Event(event);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

absl::Status Event::Record(cudaStream_t stream) {
  return ToStatus(cudaEventRecord(event_, stream), "cudaEventRecord");
}

absl::Status Event::Synchronize() const {
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, "Event::Synchronize (cudaEventSynchronize)"));
  return ToStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& stop) {
  RETURN_IF_ERROR(stop.Synchronize());
  float ms = 0.0f;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, stop.event_));
  return ms;
}

}  // namespace kiln
