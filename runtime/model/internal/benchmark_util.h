// Internal: what runtime's benchmark binaries share — die-on-error checks (benchmarks are
// programs, not library code, so they may exit), the parsing of integer-list flags and the median
// replay time of a captured graph.
#ifndef KILN_RUNTIME_MODEL_INTERNAL_BENCHMARK_UTIL_H_
#define KILN_RUNTIME_MODEL_INTERNAL_BENCHMARK_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"

// Prints the Status with its file and line and exits 1 when `expr` is not OK.
#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    const absl::Status check_status_ = (expr);                                           \
    if (!check_status_.ok()) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, check_status_.ToString().c_str()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (false)

#define CHECK_CUDA(expr) CHECK_OK(::kiln::ToStatus((expr), #expr))

namespace kiln {
namespace benchmark_internal {

// Returns the value, or prints the error and exits 1.
template <typename T>
T ValueOrDie(absl::StatusOr<T> v) {
  CHECK_OK(v.status());
  return *std::move(v);
}

// Parses the comma-separated integers of flag --`flag` (empty entries skipped) into `out`; false,
// after printing the bad entry and the range, for one that is not an integer in [min, max].
inline bool ParseIntList(const char* flag, const std::string& text, int min, int max,
                         std::vector<int>* out) {
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(piece, &v) || v < min || v > max) {
      std::fprintf(stderr, "--%s: bad entry \"%s\" (want integers in [%d, %d])\n", flag,
                   std::string(piece).c_str(), min, max);
      return false;
    }
    out->push_back(v);
  }
  return true;
}

// Captures `body` into a graph on `stream` and returns the median milliseconds of `replays`
// replays after `warmup` untimed ones (CUDA events around each replay).
inline double TimeGraph(cudaStream_t stream, const std::function<void()>& body, int warmup,
                        int replays) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  body();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  Event start = ValueOrDie(Event::Create(Event::kTiming));
  Event stop = ValueOrDie(Event::Create(Event::kTiming));
  std::vector<double> ms;
  for (int i = 0; i < warmup + replays; ++i) {
    CHECK_OK(start.Record(stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_OK(stop.Record(stream));
    const float t = ValueOrDie(Event::ElapsedMs(start, stop));
    if (i >= warmup) ms.push_back(t);
  }
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace benchmark_internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_BENCHMARK_UTIL_H_
