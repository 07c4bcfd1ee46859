#include "graph/graph_set.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/capture_guard.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Prefixes `status`'s message with `context`, keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, status.message()));
}

// Returns InvalidArgument unless `key` is one CaptureSizes can give: a GraphMode value and a size
// in [1, CaptureSizes::kMaxLimit]. `what` names the call.
absl::Status CheckKey(CaptureKey key, absl::string_view what) {
  const bool mode_ok = key.mode == GraphMode::kDecode || key.mode == GraphMode::kPrefill ||
                       key.mode == GraphMode::kMixed;
  if (!mode_ok || key.size < 1 || key.size > CaptureSizes::kMaxLimit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s of key %s (mode %d, size %d): the mode must be a GraphMode and the size in 1..%d; "
        "pass a size from CaptureSizes (PaddedSize for a live batch)",
        what, KeyName(key), static_cast<int>(key.mode), key.size, CaptureSizes::kMaxLimit));
  }
  return absl::OkStatus();
}

// The byte every output is filled with before a Verify run: an element neither run writes
// stays equal, an element only one run writes differs (unless it happens to write 0xA5 bytes).
constexpr int kPoison = 0xA5;

}  // namespace

std::string CaptureSummary::ToString() const {
  const std::string time = seconds >= 0.1 ? absl::StrFormat("%.2f s", seconds)
                                          : absl::StrFormat("%.1f ms", seconds * 1000.0);
  return absl::StrFormat("Captured %d graph%s in %s, pool %s", num_graphs,
                         num_graphs == 1 ? "" : "s", time, FormatBytes(pool_bytes));
}

void GraphSet::ExecDeleter::operator()(cudaGraphExec_t exec) const {
  if (exec != nullptr) cudaGraphExecDestroy(exec);
}

GraphSet::GraphSet(GraphMemoryPool* pool, GraphSetOptions options)
    : pool_(pool), options_(options) {}

GraphSet::~GraphSet() = default;

absl::Status GraphSet::RunEager(CaptureKey key, const StepFn& fn, cudaStream_t stream) {
  if (pool_ != nullptr) pool_->Begin(key);
  absl::Status status = fn(stream);
  if (pool_ != nullptr) pool_->End();
  return status;
}

absl::Status GraphSet::Capture(CaptureKey key, StepFn fn, cudaStream_t stream,
                               const StaticBuffers* buffers) {
  if (!fn) {
    // Calling an empty std::function throws std::bad_function_call: no exception may leave.
    return absl::InvalidArgumentError(absl::StrCat(
        "GraphSet::Capture of ", KeyName(key), " got an empty step function; pass the step"));
  }
  RETURN_IF_ERROR(CheckKey(key, "GraphSet::Capture"));
  if (options_.warmups < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphSetOptions.warmups %d for %s is negative; pass 0 or more (2 is the default)",
        options_.warmups, KeyName(key)));
  }
  graphs_.erase(key);
  Captured captured;
  captured.owner = this;
  captured.stats.key = key;

  // Warm-ups: eager, phase kWarmup, synchronized so that their errors are theirs.
  Clock::time_point start = Clock::now();
  for (int i = 0; i < options_.warmups; ++i) {
    CaptureContext::Scope scope(CapturePhase::kWarmup, key);
    absl::Status status = RunEager(key, fn, stream);
    if (!status.ok()) {
      return Annotate(status, absl::StrCat("Warm-up ", i + 1, " of ", options_.warmups, " for ",
                                           KeyName(key), " failed: "));
    }
  }
  if (options_.warmups > 0) {
    RETURN_IF_ERROR(
        ToStatus(cudaStreamSynchronize(stream), absl::StrCat("Warm-up of ", KeyName(key))));
    RETURN_IF_ERROR(ToStatus(cudaGetLastError(),
                             absl::StrCat("A launch during the warm-up of ", KeyName(key))));
  }
  captured.stats.warmup_ms = MsSince(start);

  // Capture.
  start = Clock::now();
  absl::StatusOr<OwnedGraph> graph;
  {
    CaptureGuard guard(stream, key, options_.capture_mode);
    absl::Status body = absl::OkStatus();
    if (guard.ok()) body = RunEager(key, fn, stream);  // phase kCapture, set by the guard
    graph = guard.End(std::move(body));
  }
  if (!graph.ok()) return graph.status();
  captured.stats.capture_ms = MsSince(start);
  CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph->get(), nullptr, &captured.stats.num_nodes));

  // Instantiate and upload, so the first replay does not pay for the upload.
  start = Clock::now();
  cudaGraphExec_t exec = nullptr;
  RETURN_IF_ERROR(ToStatus(cudaGraphInstantiate(&exec, graph->get(), 0),
                           absl::StrCat("cudaGraphInstantiate of ", KeyName(key))));
  captured.exec.reset(exec);
  captured.stats.instantiate_ms = MsSince(start);
  start = Clock::now();
  RETURN_IF_ERROR(
      ToStatus(cudaGraphUpload(exec, stream), absl::StrCat("cudaGraphUpload of ", KeyName(key))));
  RETURN_IF_ERROR(
      ToStatus(cudaStreamSynchronize(stream), absl::StrCat("cudaGraphUpload of ", KeyName(key))));
  captured.stats.upload_ms = MsSince(start);

  captured.fn = std::move(fn);
  captured.buffers = buffers;
  if (buffers != nullptr) captured.snapshot = buffers->Take();
  if (pool_ != nullptr) {
    captured.pool_generation = pool_->generation();
    captured.stats.pool_bytes = pool_->HighWater(key);
  }
  graphs_[key] = std::move(captured);

  if (options_.verify_on_capture) {
    start = Clock::now();
    absl::Status verified = Verify(key, stream);
    if (!verified.ok()) {
      graphs_.erase(key);
      return verified;
    }
    graphs_[key].stats.verify_ms = MsSince(start);
  }
  return absl::OkStatus();
}

absl::StatusOr<CaptureSummary> GraphSet::CaptureAll(GraphMode mode, const CaptureSizes& sizes,
                                                    KeyedStepFn fn, cudaStream_t stream,
                                                    const StaticBuffers* buffers) {
  if (!fn) {
    return absl::InvalidArgumentError(absl::StrCat("GraphSet::CaptureAll of ",
                                                   GraphModeName(mode),
                                                   " graphs got an empty step function; pass "
                                                   "the step"));
  }
  std::ostream& out = options_.progress_stream != nullptr ? *options_.progress_stream : std::cerr;
  CaptureProgress style = options_.progress;
  if (style == CaptureProgress::kAuto) {
    const bool terminal = &out == &std::cerr && isatty(fileno(stderr)) == 1;
    style = terminal ? CaptureProgress::kBar : CaptureProgress::kLines;
  }
  const std::vector<int> order = sizes.LargestFirst();
  const int n = static_cast<int>(order.size());
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < n; ++i) {
    const CaptureKey key{mode, order[i]};
    if (style == CaptureProgress::kBar) {
      constexpr int kWidth = 30;
      const int filled = i * kWidth / n;
      out << "\rCapturing " << GraphModeName(mode) << " graphs [" << std::string(filled, '#')
          << std::string(kWidth - filled, '.') << "] " << i << "/" << n << " " << KeyName(key)
          << "      " << std::flush;
    }
    absl::Status status = Capture(
        key, [fn, key](cudaStream_t s) { return fn(key, s); }, stream, buffers);
    if (!status.ok()) {
      if (style == CaptureProgress::kBar) out << "\n";
      return status;
    }
    if (style == CaptureProgress::kLines) {
      const GraphStats& stats = graphs_[key].stats;
      out << absl::StrFormat("Captured %s (%d/%d): %d nodes in %.1f ms, pool %s\n", KeyName(key),
                             i + 1, n, stats.num_nodes, stats.total_ms(),
                             FormatBytes(stats.pool_bytes));
    }
  }
  CaptureSummary summary;
  summary.num_graphs = n;
  summary.seconds = MsSince(start) / 1000.0;
  summary.pool_bytes = pool_ != nullptr ? pool_->high_water_bytes() : 0;
  if (style == CaptureProgress::kBar) {
    out << "\rCapturing " << GraphModeName(mode) << " graphs [" << std::string(30, '#') << "] " << n
        << "/" << n << std::string(16, ' ') << "\n";
  }
  if (style != CaptureProgress::kQuiet) out << summary.ToString() << "\n" << std::flush;
  return summary;
}

absl::Status GraphSet::CheckReplayable(CaptureKey key, const Captured& captured) const {
  if (captured.buffers != nullptr) {
    RETURN_IF_ERROR(captured.buffers->CheckUnchanged(captured.snapshot, key));
  }
  if (pool_ != nullptr && pool_->generation() != captured.pool_generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "The graph memory pool was re-reserved after ", KeyName(key),
        " was captured; the graph still uses the old region: capture ", KeyName(key), " again"));
  }
  return absl::OkStatus();
}

absl::Status GraphSet::Replay(CaptureKey key, cudaStream_t stream) const {
  // Every key in graphs_ passed CheckKey at Capture: only a key that is not there is checked.
  const Graph* graph = Find(key);
  if (graph == nullptr) {
    RETURN_IF_ERROR(CheckKey(key, "GraphSet::Replay"));
    return absl::FailedPreconditionError(
        absl::StrCat("No graph for ", KeyName(key), "; capture it first, or run the step eagerly"));
  }
  return Replay(*graph, stream);
}

const GraphSet::Graph* GraphSet::Find(CaptureKey key) const {
  auto it = graphs_.find(key);
  return it == graphs_.end() ? nullptr : &it->second;
}

absl::Status GraphSet::Replay(const Graph& graph, cudaStream_t stream) const {
  const Captured& captured = static_cast<const Captured&>(graph);  // Graph's only subclass
  const CaptureKey key = captured.stats.key;
  if (captured.owner != this) {
    // CheckReplayable compares with this set's pool, not the one the graph was captured in.
    return absl::InvalidArgumentError(absl::StrCat(
        "GraphSet::Replay got the graph of ", KeyName(key),
        " that another GraphSet holds; replay a graph with the set that Find returned it from"));
  }
  RETURN_IF_ERROR(CheckReplayable(key, captured));
  // The key's name only on failure: a replay makes no string.
  const cudaError_t launched = cudaGraphLaunch(captured.exec.get(), stream);
  if (launched == cudaSuccess) return absl::OkStatus();
  return ToStatus(launched, absl::StrCat("cudaGraphLaunch of ", KeyName(key)));
}

absl::Status GraphSet::Verify(CaptureKey key, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckKey(key, "GraphSet::Verify"));
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("No graph for ", KeyName(key), " to verify; capture it first"));
  }
  const Captured& captured = it->second;
  RETURN_IF_ERROR(CheckReplayable(key, captured));
  const std::vector<StaticBuffers::Entry>* entries =
      captured.buffers != nullptr ? &captured.buffers->entries() : nullptr;
  const size_t n = captured.snapshot.items.size();
  size_t total_bytes = 0, output_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const StaticBuffers::Entry& e = (*entries)[i];
    // A wrapped sum would allocate a small snapshot that the copies below overrun.
    if (e.bytes > std::numeric_limits<size_t>::max() - total_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "Verify of %s cannot snapshot its static buffers: with '%s' (%d bytes) they add up to "
          "more than the address space; declare each buffer's real size",
          KeyName(key), e.name, e.bytes));
    }
    total_bytes += e.bytes;
    if (e.role == BufferRole::kOutput) output_bytes += e.bytes;  // at most total_bytes
  }
  if (output_bytes == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Verify of ", KeyName(key),
        " needs at least one static buffer declared kOutput; declare the step's outputs"));
  }

  // Every buffer is saved and restored, so an in-place step (a cache append) verifies too and
  // the caller's state is unchanged afterwards.
  ASSIGN_OR_RETURN(DeviceBuffer saved, DeviceBuffer::Allocate(total_bytes, "verify snapshot"));
  ASSIGN_OR_RETURN(PinnedHostBuffer eager_out,
                   PinnedHostBuffer::Allocate(output_bytes, "verify eager outputs"));
  ASSIGN_OR_RETURN(PinnedHostBuffer graph_out,
                   PinnedHostBuffer::Allocate(output_bytes, "verify graph outputs"));
  auto copy_all = [&](bool save) -> absl::Status {
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const StaticBuffers::Entry& e = (*entries)[i];
      char* snapshot = saved.as<char>() + offset;
      RETURN_IF_ERROR(save ? CopyDeviceToDevice(snapshot, e.address, e.bytes, stream)
                           : CopyDeviceToDevice(e.address, snapshot, e.bytes, stream));
      offset += e.bytes;
    }
    return absl::OkStatus();
  };
  auto poison_outputs = [&]() -> absl::Status {
    for (size_t i = 0; i < n; ++i) {
      const StaticBuffers::Entry& e = (*entries)[i];
      if (e.role != BufferRole::kOutput) continue;
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(e.address, kPoison, e.bytes, stream));
    }
    return absl::OkStatus();
  };
  auto fetch_outputs = [&](PinnedHostBuffer& host) -> absl::Status {
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const StaticBuffers::Entry& e = (*entries)[i];
      if (e.role != BufferRole::kOutput) continue;
      RETURN_IF_ERROR(CopyDeviceToHost(host.as<char>() + offset, e.address, e.bytes, stream));
      offset += e.bytes;
    }
    return absl::OkStatus();
  };

  RETURN_IF_ERROR(copy_all(/*save=*/true));
  RETURN_IF_ERROR(poison_outputs());
  absl::Status eager = RunEager(key, captured.fn, stream);
  if (!eager.ok()) {
    return Annotate(eager, absl::StrCat("The eager run verifying ", KeyName(key), " failed: "));
  }
  RETURN_IF_ERROR(fetch_outputs(eager_out));
  RETURN_IF_ERROR(copy_all(/*save=*/false));
  RETURN_IF_ERROR(poison_outputs());
  RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(captured.exec.get(), stream),
                           absl::StrCat("cudaGraphLaunch of ", KeyName(key), " (verify)")));
  RETURN_IF_ERROR(fetch_outputs(graph_out));
  RETURN_IF_ERROR(copy_all(/*save=*/false));
  RETURN_IF_ERROR(
      ToStatus(cudaStreamSynchronize(stream), absl::StrCat("Verify of ", KeyName(key))));

  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const StaticBuffers::Entry& e = (*entries)[i];
    if (e.role != BufferRole::kOutput) continue;
    const unsigned char* a = graph_out.as<unsigned char>() + offset;
    const unsigned char* b = eager_out.as<unsigned char>() + offset;
    if (std::memcmp(a, b, e.bytes) != 0) {
      size_t first = 0;
      while (a[first] == b[first]) ++first;
      size_t differing = 0;
      for (size_t j = first; j < e.bytes; ++j) differing += a[j] != b[j];
      return absl::InternalError(absl::StrFormat(
          "Graph %s differs from an eager run: output '%s' first differs at byte offset %d "
          "(graph 0x%02x, eager 0x%02x; %d of %d bytes differ); a launch parameter or host value "
          "was frozen at capture (read batch contents from device memory, and CaptureContext on "
          "every call), or the step is nondeterministic",
          KeyName(key), e.name, first, a[first], b[first], differing, e.bytes));
    }
    offset += e.bytes;
  }
  return absl::OkStatus();
}

const GraphStats* GraphSet::Stats(CaptureKey key) const {
  auto it = graphs_.find(key);
  return it == graphs_.end() ? nullptr : &it->second.stats;
}

std::vector<GraphStats> GraphSet::AllStats() const {
  std::vector<GraphStats> out;
  out.reserve(graphs_.size());
  for (const auto& [key, captured] : graphs_) out.push_back(captured.stats);
  std::sort(out.begin(), out.end(),
            [](const GraphStats& a, const GraphStats& b) { return a.key < b.key; });
  return out;
}

}  // namespace kiln
