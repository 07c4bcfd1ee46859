// graph_benchmark: what a CUDA graph saves on a chain of small kernels, what capturing one costs,
// and what the shared graph pool holds.
//
//   bazel build -c opt //graph:graph_benchmark && bazel-bin/graph/graph_benchmark
//
// 1. A chain of K dependent one-block kernels (K = 100, 1000), launched eagerly and replayed as
//    a graph, with and without programmatic dependent launch (PDL): microseconds per kernel,
//    the median over 21 timed runs after 3 warm-ups, timed with CUDA events.
// 2. Capture + instantiate (+ upload) of a 1000-node graph: host time, median of 11.
// 3. GraphSet::Replay's host cost (static-buffer checks) against a bare cudaGraphLaunch.
// 4. GraphSet::CaptureAll over the default decode sizes up to 256, each size taking scratch from
//    one GraphMemoryPool: capture time and pool bytes (maximum over sizes) against the sum.
// Every chain's result is checked (each kernel adds 1 to 32 counters that start at random
// integers); the program exits 1 on any error or wrong result.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "graph/capture_guard.h"
#include "graph/capture_sizes.h"
#include "graph/graph_memory_pool.h"
#include "graph/graph_set.h"
#include "graph/internal/test_kernels.h"
#include "graph/static_buffers.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace {

constexpr int kWarmups = 3;
constexpr int kTimedRuns = 21;
constexpr int kCounters = 32;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using LaunchFn = cudaError_t (*)(float*, cudaStream_t);

absl::Status LaunchChain(LaunchFn launch, float* x, int k, cudaStream_t stream) {
  for (int i = 0; i < k; ++i) CUDA_RETURN_IF_ERROR(launch(x, stream));
  return absl::OkStatus();
}

// The counters on the device, and what they must hold.
class Counters {
 public:
  static absl::StatusOr<Counters> Create() {
    Counters c;
    ASSIGN_OR_RETURN(c.device_, DeviceBuffer::Allocate(kCounters * sizeof(float), "counters"));
    std::mt19937 rng(std::random_device{}());
    c.expected_.resize(kCounters);
    for (float& v : c.expected_) v = static_cast<float>(rng() % 1000 + 1);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(c.device_.data(), c.expected_.data(), kCounters * sizeof(float),
                                    cudaMemcpyHostToDevice));
    return c;
  }
  float* data() const { return device_.as<float>(); }
  void Add(int kernels) {
    for (float& v : expected_) v += static_cast<float>(kernels);
  }
  // Returns OK when every counter holds its expected value (exact: integers below 2^24).
  absl::Status Check(const std::string& what) const {
    std::vector<float> got(kCounters);
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(got.data(), device_.data(), kCounters * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < kCounters; ++i) {
      if (got[i] != expected_[i]) {
        return absl::InternalError(absl::StrFormat("%s: counter %d is %.1f, expected %.1f", what, i,
                                                   got[i], expected_[i]));
      }
    }
    return absl::OkStatus();
  }

 private:
  DeviceBuffer device_;
  std::vector<float> expected_;
};

struct ChainResult {
  double eager_us_per_kernel = 0;
  double graph_us_per_kernel = 0;
};

absl::StatusOr<ChainResult> TimeChain(LaunchFn launch, int k, const std::string& name,
                                      Counters& counters, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Event start, Event::Create(Event::kTiming));
  ASSIGN_OR_RETURN(Event stop, Event::Create(Event::kTiming));
  ChainResult result;

  // Eager.
  std::vector<double> ms;
  for (int run = 0; run < kWarmups + kTimedRuns; ++run) {
    RETURN_IF_ERROR(start.Record(stream));
    RETURN_IF_ERROR(LaunchChain(launch, counters.data(), k, stream));
    RETURN_IF_ERROR(stop.Record(stream));
    ASSIGN_OR_RETURN(float elapsed, Event::ElapsedMs(start, stop));
    if (run >= kWarmups) ms.push_back(elapsed);
  }
  counters.Add((kWarmups + kTimedRuns) * k);
  RETURN_IF_ERROR(counters.Check(absl::StrFormat("eager %s chain of %d", name, k)));
  result.eager_us_per_kernel = Median(ms) * 1000.0 / k;

  // Graph.
  OwnedGraph graph;
  {
    CaptureGuard guard(stream, {GraphMode::kDecode, k});
    absl::Status body =
        guard.ok() ? LaunchChain(launch, counters.data(), k, stream) : absl::OkStatus();
    ASSIGN_OR_RETURN(graph, guard.End(body));
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph.get(), 0));
  CUDA_RETURN_IF_ERROR(cudaGraphUpload(exec, stream));
  ms.clear();
  absl::Status status = absl::OkStatus();
  for (int run = 0; run < kWarmups + kTimedRuns && status.ok(); ++run) {
    status = start.Record(stream);
    if (status.ok()) status = ToStatus(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    if (status.ok()) status = stop.Record(stream);
    absl::StatusOr<float> elapsed =
        status.ok() ? Event::ElapsedMs(start, stop) : absl::StatusOr<float>(status);
    status = elapsed.status();
    if (status.ok() && run >= kWarmups) ms.push_back(*elapsed);
  }
  cudaGraphExecDestroy(exec);
  RETURN_IF_ERROR(status);
  counters.Add((kWarmups + kTimedRuns) * k);
  RETURN_IF_ERROR(counters.Check(absl::StrFormat("replayed %s chain of %d", name, k)));
  result.graph_us_per_kernel = Median(ms) * 1000.0 / k;
  return result;
}

struct CaptureCost {
  double capture_ms = 0;
  double instantiate_ms = 0;
  double upload_ms = 0;
  size_t nodes = 0;
};

absl::StatusOr<CaptureCost> TimeCapture(int k, Counters& counters, cudaStream_t stream) {
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  std::vector<double> capture, instantiate, upload;
  CaptureCost cost;
  for (int run = 0; run < 1 + 11; ++run) {  // the first run warms the driver's caches
    Clock::time_point t = Clock::now();
    OwnedGraph graph;
    {
      CaptureGuard guard(stream, {GraphMode::kDecode, k});
      absl::Status body = guard.ok()
                              ? LaunchChain(graph_internal::LaunchTick, counters.data(), k, stream)
                              : absl::OkStatus();
      ASSIGN_OR_RETURN(graph, guard.End(body));
    }
    const double c = ms_since(t);
    t = Clock::now();
    cudaGraphExec_t exec = nullptr;
    CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph.get(), 0));
    const double i = ms_since(t);
    t = Clock::now();
    CUDA_RETURN_IF_ERROR(cudaGraphUpload(exec, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const double u = ms_since(t);
    CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph.get(), nullptr, &cost.nodes));
    CUDA_RETURN_IF_ERROR(cudaGraphExecDestroy(exec));
    if (run > 0) {
      capture.push_back(c);
      instantiate.push_back(i);
      upload.push_back(u);
    }
  }
  cost.capture_ms = Median(capture);
  cost.instantiate_ms = Median(instantiate);
  cost.upload_ms = Median(upload);
  return cost;
}

struct ReplayCost {
  double graph_set_us = 0;
  double bare_us = 0;
};

absl::StatusOr<ReplayCost> TimeReplayChecks(Counters& counters, cudaStream_t stream) {
  using Clock = std::chrono::steady_clock;
  constexpr int kBuffers = 32, kCalls = 2000;
  std::vector<DeviceBuffer> storage;
  StaticBuffers buffers;
  for (int i = 0; i < kBuffers; ++i) {
    ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(256, "static"));
    RETURN_IF_ERROR(
        buffers.Bind(absl::StrFormat("buffer %d", i), b.data(), b.size(), BufferRole::kInput));
    storage.push_back(std::move(b));
  }
  GraphSetOptions options;
  options.warmups = 1;
  GraphSet graphs(nullptr, options);
  const CaptureKey key{GraphMode::kDecode, 1};
  RETURN_IF_ERROR(graphs.Capture(
      key,
      [&counters](cudaStream_t s) {
        return LaunchChain(graph_internal::LaunchTick, counters.data(), 1, s);
      },
      stream, &buffers));
  counters.Add(options.warmups);
  OwnedGraph graph;
  {
    CaptureGuard guard(stream, key);
    absl::Status body = guard.ok()
                            ? LaunchChain(graph_internal::LaunchTick, counters.data(), 1, stream)
                            : absl::OkStatus();
    ASSIGN_OR_RETURN(graph, guard.End(body));
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph.get(), 0));
  ReplayCost cost;
  std::vector<double> set_us, bare_us;
  for (int round = 0; round < 5; ++round) {
    Clock::time_point t = Clock::now();
    for (int i = 0; i < kCalls; ++i) RETURN_IF_ERROR(graphs.Replay(key, stream));
    set_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / kCalls);
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    t = Clock::now();
    for (int i = 0; i < kCalls; ++i) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    bare_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / kCalls);
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  cudaGraphExecDestroy(exec);
  counters.Add(5 * 2 * kCalls);
  RETURN_IF_ERROR(counters.Check("replays through GraphSet"));
  cost.graph_set_us = Median(set_us);
  cost.bare_us = Median(bare_us);
  return cost;
}

absl::Status Run() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
  CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  std::printf("GPU: %s (sm_%d%d), driver %d, runtime %d\n", prop.name, prop.major, prop.minor,
              driver, runtime);
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(Counters counters, Counters::Create());

  struct Row {
    int k;
    ChainResult plain, pdl;
  };
  std::vector<Row> rows;
  const bool pdl_supported = prop.major >= 9;
  for (int k : {100, 1000}) {
    Row row{k, {}, {}};
    ASSIGN_OR_RETURN(row.plain,
                     TimeChain(graph_internal::LaunchTick, k, "plain", counters, stream.get()));
    if (pdl_supported) {
      ASSIGN_OR_RETURN(row.pdl,
                       TimeChain(graph_internal::LaunchTickPdl, k, "PDL", counters, stream.get()));
    }
    rows.push_back(row);
  }

  ASSIGN_OR_RETURN(CaptureCost cost, TimeCapture(1000, counters, stream.get()));

  // Pool: every default decode size up to 256 takes size * 64 KiB + 1 MiB of scratch.
  ASSIGN_OR_RETURN(CaptureSizes sizes, CaptureSizes::Decode(256));
  ASSIGN_OR_RETURN(GraphMemoryPool pool, GraphMemoryPool::Create(64 << 20));
  GraphSetOptions options;
  options.progress = CaptureProgress::kQuiet;
  GraphSet graphs(&pool, options);
  ASSIGN_OR_RETURN(
      CaptureSummary summary,
      graphs.CaptureAll(
          GraphMode::kDecode, sizes,
          [&pool](CaptureKey key, cudaStream_t s) -> absl::Status {
            ASSIGN_OR_RETURN(void* fixed, pool.Allocate(1 << 20, "fixed workspace"));
            const size_t bytes = static_cast<size_t>(key.size) * (64 << 10);
            ASSIGN_OR_RETURN(void* scratch, pool.Allocate(bytes, "per-sequence scratch"));
            CUDA_RETURN_IF_ERROR(
                graph_internal::LaunchFill(static_cast<float*>(fixed), (1 << 20) / 4, 1.0f, s));
            CUDA_RETURN_IF_ERROR(graph_internal::LaunchFill(static_cast<float*>(scratch),
                                                            static_cast<int>(bytes / 4), 2.0f, s));
            return absl::OkStatus();
          },
          stream.get()));
  size_t sum_over_keys = 0;
  double max_capture_ms = 0;
  for (const GraphStats& s : graphs.AllStats()) {
    sum_over_keys += s.pool_bytes;
    max_capture_ms = std::max(max_capture_ms, s.total_ms());
  }
  for (const GraphStats& s : graphs.AllStats()) {
    RETURN_IF_ERROR(graphs.Replay(s.key, stream.get()));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));

  // Host cost of GraphSet::Replay's checks: a one-kernel graph with 32 declared static buffers,
  // against a bare cudaGraphLaunch of the same executable graph.
  ASSIGN_OR_RETURN(ReplayCost replay_cost, TimeReplayChecks(counters, stream.get()));

  std::printf(
      "\n| chain of K kernels | eager us/kernel | graph replay us/kernel | "
      "eager+PDL us/kernel | graph+PDL us/kernel |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| K = %d | %.2f | %.2f | %.2f | %.2f |\n", r.k, r.plain.eager_us_per_kernel,
                r.plain.graph_us_per_kernel, r.pdl.eager_us_per_kernel, r.pdl.graph_us_per_kernel);
  }
  std::printf("\n| capture of a %zu-node graph | ms |\n|---|---|\n", cost.nodes);
  std::printf(
      "| capture (begin..end) | %.3f |\n| instantiate | %.3f |\n"
      "| capture + instantiate | %.3f |\n| upload | %.3f |\n",
      cost.capture_ms, cost.instantiate_ms, cost.capture_ms + cost.instantiate_ms, cost.upload_ms);
  std::printf("\n%s (%zu decode sizes up to 256, slowest %.2f ms with 2 warm-ups)\n",
              summary.ToString().c_str(), sizes.sizes().size(), max_capture_ms);
  std::printf("pool high-water %s = max over sizes; the sum over sizes would be %s\n",
              FormatBytes(pool.high_water_bytes()).c_str(), FormatBytes(sum_over_keys).c_str());
  std::printf(
      "GraphSet::Replay with 32 static buffers: %.2f us host time per call; bare "
      "cudaGraphLaunch %.2f us\n",
      replay_cost.graph_set_us, replay_cost.bare_us);
  const size_t expected_pool = (1 << 20) + size_t{256} * (64 << 10);
  if (pool.high_water_bytes() != expected_pool) {
    return absl::InternalError(absl::StrFormat("Pool high-water %d bytes, expected %d",
                                               pool.high_water_bytes(), expected_pool));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kiln

int main() {
  const absl::Status status = kiln::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "graph_benchmark failed: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
