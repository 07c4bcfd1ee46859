// RAII CUDA event, for ordering streams and for timing.
//
//   ASSIGN_OR_RETURN(kiln::Event start, kiln::Event::Create(kiln::Event::kTiming));
//   ASSIGN_OR_RETURN(kiln::Event stop, kiln::Event::Create(kiln::Event::kTiming));
//   RETURN_IF_ERROR(start.Record(stream.get()));
//   ... work ...
//   RETURN_IF_ERROR(stop.Record(stream.get()));
//   ASSIGN_OR_RETURN(float ms, kiln::Event::ElapsedMs(start, stop));   // waits for stop
//
// Movable, not copyable. Record may be called during capture (it becomes an event node);
// Synchronize and ElapsedMs may not (FailedPrecondition).
#ifndef KILN_RUNTIME_CUDA_EVENT_H_
#define KILN_RUNTIME_CUDA_EVENT_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

class Event {
 public:
  enum Kind {
    kOrdering,  // cudaEventDisableTiming: cheapest, for cross-stream waits.
    kTiming,    // records timestamps for ElapsedMs.
  };

  // Creates an event on the current device.
  static absl::StatusOr<Event> Create(Kind kind = kOrdering);

  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Returns the raw handle; the Event keeps ownership.
  cudaEvent_t get() const { return event_; }

  // Records the event on `stream`.
  absl::Status Record(cudaStream_t stream);

  // Waits until the event has completed. FailedPrecondition during capture.
  absl::Status Synchronize() const;

  // Waits for `stop` and returns the milliseconds between `start` and `stop` (both kTiming).
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& stop);

 private:
  explicit Event(cudaEvent_t event) : event_(event) {}
  cudaEvent_t event_ = nullptr;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_EVENT_H_
