#ifndef KILN_RUNTIME_CUDA_KERNEL_TRACE_H_
#define KILN_RUNTIME_CUDA_KERNEL_TRACE_H_

// Where a CUDA graph replay's time goes, kernel by kernel, without a profiler: KernelTrace records
// the GPU start and end of every kernel the process runs while it is active (CUPTI's activity
// records; a graph replay reports each kernel node), and ProfileReplays turns the records of one
// graph replayed several times into each kernel's share of the replay's critical path.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::KernelTrace> trace, kiln::KernelTrace::Start());
//   ... replay the graph a few times ...
//   ASSIGN_OR_RETURN(std::vector<kiln::KernelRecord> records, trace->Finish());
//   ASSIGN_OR_RETURN(kiln::ReplayProfile profile, kiln::ProfileReplays(records));
//
// Time a run without the trace as well before reading a traced span as a step time. On an H200
// the 1B decode step at batch 1 spanned 885.5 µs traced, against 0.897 ms timed untraced with CUDA
// events (which also count the metadata upload and the copy of the sampled tokens).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

struct KernelRecord {
  uint64_t start_ns = 0;  // GPU timestamps
  uint64_t end_ns = 0;
  uint32_t graph_id = 0;    // 0: launched outside a graph
  uint64_t graph_node = 0;  // the kernel's node in its graph
  std::string name;         // demangled where it demangles
};

class KernelTrace {
 public:
  // Starts recording. One trace at a time per process: a second Start before the first one's
  // Finish (or destruction) is refused, as is a process where CUPTI cannot record kernels.
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Waits for the device, stops recording and returns the kernels recorded since Start, in
  // order of their start. Once only.
  absl::StatusOr<std::vector<KernelRecord>> Finish();

 private:
  KernelTrace() = default;
  bool finished_ = false;
};

// One kernel's part of a replay.
struct KernelShare {
  std::string kernel;  // ShortKernelName of the kernel
  int launches = 0;    // nodes of the replay that run it
  double us = 0;       // the sum of their increments
};

// One kernel node's part of a replay.
struct NodeShare {
  std::string kernel;  // ShortKernelName of the kernel
  double us = 0;       // its increment
};

struct ReplayProfile {
  int replays = 0;                  // replays of the graph found in the records
  int kernels = 0;                  // kernel nodes per replay
  double span_us = 0;               // the profiled replay, first start to last end
  std::vector<KernelShare> shares;  // largest first; they sum to span_us
  std::vector<NodeShare> nodes;     // the profiled replay's kernels in order of their start
};

// A block of kernels that a replay runs several times in a row (a model's layers).
struct RepeatedBlock {
  int first = 0;    // index in ReplayProfile::nodes of the block's first kernel
  int repeats = 0;  // consecutive runs of the block
  // The block's kernels in order, each with the median of its increments over the repeats.
  std::vector<NodeShare> nodes;
};

// Profiles the replays of one graph in `records` (kernels outside graphs are ignored; of several
// graphs, the one with the most kernel records). A replay ends where a node of it appears again,
// so every replay must run each kernel node once. Of the replays, the one with the median span
// is profiled: each kernel's increment is its end minus the latest end before it (the replay's
// first start for the first kernel), 0 where it ends before that. With programmatic dependent
// launch the kernels overlap; the increments are what each adds to the replay's critical path,
// and they sum to its span. Errors: no graph kernels, replays with different node counts, or a
// kernel of the graph that ends before it starts.
absl::StatusOr<ReplayProfile> ProfileReplays(std::vector<KernelRecord> records);

// Returns the block of kernel names that repeats back to back over the most of `nodes` at least
// `min_repeats` times (ties: the shortest block, then the earliest), or nullopt where none does.
// Of a decoder step, that is one layer: its kernels with their median increments over the layers,
// so projections that share a kernel are told apart by their place in the layer.
std::optional<RepeatedBlock> FindRepeatedBlock(const std::vector<NodeShare>& nodes,
                                               int min_repeats = 3);

// A kernel's demangled name without its return type, namespaces and parameter list, template
// arguments kept (at most 80 bytes, cut between UTF-8 characters): "void kiln::(anonymous
// namespace)::Kern<4, true>(int)" gives "Kern<4, true>".
std::string ShortKernelName(std::string_view demangled);

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_KERNEL_TRACE_H_
