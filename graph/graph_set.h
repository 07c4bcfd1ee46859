// Captured CUDA graphs keyed by (mode, padded size): warm up, capture, instantiate, upload,
// check the static buffers before each replay, and optionally prove each graph equal to an eager
// run, bit for bit.
//
//   ASSIGN_OR_RETURN(kiln::CaptureSizes sizes, kiln::CaptureSizes::Decode(max_num_seqs));
//   ASSIGN_OR_RETURN(kiln::GraphMemoryPool pool, kiln::GraphMemoryPool::Create(pool_budget));
//   kiln::GraphSetOptions options;
//   options.verify_on_capture = true;
//   kiln::GraphSet graphs(&pool, options);
//   ASSIGN_OR_RETURN(kiln::CaptureSummary summary,
//                    graphs.CaptureAll(kiln::GraphMode::kDecode, sizes, step, stream, &buffers));
//   // "Captured 27 graphs in 0.84 s, pool 12.0 MiB" (and a progress bar on a terminal)
//   ...
//   std::optional<int> padded = sizes.PaddedSize(num_seqs);
//   {
//     kiln::ReplayPrepareScope prepare({kiln::GraphMode::kDecode, *padded});
//     RETURN_IF_ERROR(UploadPlan(stream));           // host work before the replay
//   }
//   RETURN_IF_ERROR(graphs.Replay({kiln::GraphMode::kDecode, *padded}, stream));
//   // Or, deciding whether to replay before anything else and replaying later, one lookup:
//   const kiln::GraphSet::Graph* graph = graphs.Find({kiln::GraphMode::kDecode, *padded});
//   ...   // null: run the step eagerly
//   RETURN_IF_ERROR(graphs.Replay(*graph, stream));
//
// Per key: absent ──Capture──► captured ──Replay──► captured (any number of times)
//                              captured ──Capture──► captured (replaced)
// Capture(key, fn): `warmups` eager runs of fn with CaptureContext::Phase() == kWarmup (so a
// component's eager decisions are made there and asked again under capture), a capture of fn
// under CaptureGuard (phase kCapture), cudaGraphInstantiate, cudaGraphUpload (so the first replay
// is not slow), then optionally Verify. Each warm-up and the capture start the graph memory
// pool's sequence for the key at the pool's base. Capture time, node count and pool bytes are
// kept per key (Stats).
//
// Replay(key) checks, in O(buffers), that every static buffer declared at capture is still at
// its address and size (FailedPrecondition naming the buffer otherwise) and that the pool's
// region has not moved, then launches the graph. Find(key) looks a graph up once, and
// Replay(graph) makes the same checks and launch without looking it up again.
//
// Verify(key): snapshots every static buffer, runs fn eagerly and the graph, each from the same
// snapshot with poisoned outputs, compares the kOutput buffers bit for bit, and restores the
// snapshot. A mismatch is Internal naming the buffer and its first differing byte offset: a
// launch parameter or host value frozen at capture (a grid computed from batch contents, a
// decision cached outside CaptureContext) or a nondeterministic kernel.
//
// Not thread-safe; graphs replay one at a time on one stream (the pool is shared between them).
// Neither the pool nor the StaticBuffers registries are owned; they must outlive the GraphSet.
// Nothing here may be called during a capture.
#ifndef KILN_GRAPH_GRAPH_SET_H_
#define KILN_GRAPH_GRAPH_SET_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/capture_context.h"
#include "graph/capture_sizes.h"
#include "graph/graph_memory_pool.h"
#include "graph/static_buffers.h"

namespace kiln {

// How CaptureAll reports progress.
enum class CaptureProgress {
  kAuto,   // a bar when the stream is stderr and stderr is a terminal, else one line per graph
  kBar,    // a bar redrawn in place
  kLines,  // one line per graph
  kNone,   // only the summary line
  kQuiet,  // nothing
};

struct GraphSetOptions {
  // Eager runs before each capture (phase kWarmup): they load modules, create library handles
  // and settle lazily sized buffers, none of which may happen during capture.
  int warmups = 2;
  // Runs Verify on every new graph; a graph that differs from eager is dropped and Capture fails.
  bool verify_on_capture = false;
  // The capture mode CaptureGuard begins with.
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  // CaptureAll's progress reporting, written to `progress_stream` (std::cerr when null).
  CaptureProgress progress = CaptureProgress::kAuto;
  std::ostream* progress_stream = nullptr;
};

// What one capture cost.
struct GraphStats {
  CaptureKey key;
  double warmup_ms = 0;       // the warm-up runs, synchronized
  double capture_ms = 0;      // running fn under capture
  double instantiate_ms = 0;  // cudaGraphInstantiate
  double upload_ms = 0;       // cudaGraphUpload, synchronized
  double verify_ms = 0;       // Verify (0 when off)
  size_t num_nodes = 0;       // nodes in the captured graph
  size_t pool_bytes = 0;      // the pool's high-water mark for this key

  // Returns the whole capture time: warm-up + capture + instantiate + upload + verify.
  double total_ms() const {
    return warmup_ms + capture_ms + instantiate_ms + upload_ms + verify_ms;
  }
};

// What CaptureAll did.
struct CaptureSummary {
  int num_graphs = 0;
  double seconds = 0;
  size_t pool_bytes = 0;  // the pool's high-water mark (0 without a pool)
  // Returns "Captured 35 graphs in 0.84 s, pool 12.0 MiB" (milliseconds under 0.1 s).
  std::string ToString() const;
};

// The captured step: enqueue the work on `stream` and return its status. Called for warm-ups,
// the capture and Verify's eager run; it must make the same pool allocations in the same order
// each time and read CaptureContext::Phase() on every call instead of caching it.
using StepFn = std::function<absl::Status(cudaStream_t stream)>;

// A step parameterized by the key, for CaptureAll.
using KeyedStepFn = std::function<absl::Status(CaptureKey key, cudaStream_t stream)>;

class GraphSet {
 public:
  // Creates an empty set. `pool` (nullable, not owned) gives each capture its scratch memory.
  explicit GraphSet(GraphMemoryPool* pool = nullptr, GraphSetOptions options = {});
  ~GraphSet();
  GraphSet(const GraphSet&) = delete;
  GraphSet& operator=(const GraphSet&) = delete;

  // Warms up, captures, instantiates and uploads `fn` for `key` on `stream` (a non-default
  // stream), replacing any graph `key` had. `buffers` (nullable, not owned, must outlive the
  // graph) declares the static buffers fn uses; it is snapshotted now and checked at Replay.
  // Errors name the key and the phase that failed: the warm-up's own status, CaptureGuard's
  // explanation, or Verify's mismatch; InvalidArgument for an empty `fn`, a key that is not a
  // GraphMode with a size in 1..CaptureSizes::kMaxLimit, or negative options.warmups (all before
  // anything runs or is dropped). On error no graph is kept for `key`, and the stream is usable.
  absl::Status Capture(CaptureKey key, StepFn fn, cudaStream_t stream,
                       const StaticBuffers* buffers = nullptr);

  // Captures `fn` for every size of `sizes`, largest first, as keys {mode, size}, reporting
  // progress (see GraphSetOptions) and ending with a summary line. Stops at the first error;
  // InvalidArgument for an empty `fn`.
  absl::StatusOr<CaptureSummary> CaptureAll(GraphMode mode, const CaptureSizes& sizes,
                                            KeyedStepFn fn, cudaStream_t stream,
                                            const StaticBuffers* buffers = nullptr);

  // Launches the graph for `key` on `stream`, after checking its static buffers (O(buffers)) and
  // the pool's region. InvalidArgument for a key Capture would refuse; FailedPrecondition when
  // `key` has no graph, a buffer moved or the pool was re-reserved. Asynchronous.
  absl::Status Replay(CaptureKey key, cudaStream_t stream) const;

  // A captured graph, as Find returns it; opaque, owned by the set. Valid until the set next
  // captures or erases a graph (either may move the graphs in its table) or is destroyed. Only
  // the set makes, copies or moves one: its constructors are private (a user-provided default
  // constructor, so that it is no aggregate either), so a caller holds a Graph only by reference
  // to one that Find returned: a copy does not compile, nor does constructing a subclass.
  class Graph {
   private:
    friend class GraphSet;
    Graph() {}
    Graph(const Graph&) = default;
    Graph& operator=(const Graph&) = default;
  };

  // Returns the graph of `key`, or nullptr when it has none (any key, valid or not), in one hash
  // lookup: for a caller that decides whether to replay before it enqueues anything and replays
  // later through Replay(graph, stream), without a second lookup.
  const Graph* Find(CaptureKey key) const;

  // Launches `graph`, which this set's Find returned, on `stream` after the checks Replay(key)
  // makes of a key that has a graph: FailedPrecondition when a static buffer moved or the pool
  // was re-reserved, with Replay(key)'s messages. InvalidArgument, before anything is launched,
  // for a graph that another set's Find returned. Asynchronous.
  absl::Status Replay(const Graph& graph, cudaStream_t stream) const;

  // Compares the graph for `key` with an eager run of its function, bit for bit, over the
  // declared kOutput buffers, from the buffers' current contents (which it restores). Synchronizes
  // `stream`. InvalidArgument for a key Capture would refuse; FailedPrecondition when there is no
  // graph or no output buffer; ResourceExhausted when the buffers' sizes add up past size_t;
  // Internal naming the buffer and first differing byte offset on a mismatch.
  absl::Status Verify(CaptureKey key, cudaStream_t stream);

  // Returns true if `key` has a graph.
  bool Contains(CaptureKey key) const { return graphs_.contains(key); }
  // Returns the number of graphs.
  size_t size() const { return graphs_.size(); }
  // Returns the capture statistics of `key`, or nullptr when it has no graph.
  const GraphStats* Stats(CaptureKey key) const;
  // Returns the statistics of every graph, ordered by key.
  std::vector<GraphStats> AllStats() const;
  // Drops the graph of `key` (no-op if none).
  void Erase(CaptureKey key) { graphs_.erase(key); }

 private:
  struct ExecDeleter {
    void operator()(cudaGraphExec_t exec) const;
  };
  using OwnedExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, ExecDeleter>;
  // Every Graph is a Captured: Graph's constructors are private to the set and this is its only
  // subclass.
  struct Captured : Graph {
    const GraphSet* owner = nullptr;  // the set whose table holds it
    OwnedExec exec;
    StepFn fn;
    const StaticBuffers* buffers = nullptr;
    StaticBuffers::Snapshot snapshot;
    uint64_t pool_generation = 0;
    GraphStats stats;
  };
  struct KeyHash {
    size_t operator()(const CaptureKey& key) const {
      return static_cast<size_t>(key.size) * 4 + static_cast<size_t>(key.mode);
    }
  };

  absl::Status CheckReplayable(CaptureKey key, const Captured& captured) const;
  absl::Status RunEager(CaptureKey key, const StepFn& fn, cudaStream_t stream);

  GraphMemoryPool* pool_;
  GraphSetOptions options_;
  absl::flat_hash_map<CaptureKey, Captured, KeyHash> graphs_;
};

// Sets CaptureContext's phase to kReplayPrepare for `key` during host-side setup before a replay
// (plans, metadata uploads), so components can tell it from eager work. Not movable.
class ReplayPrepareScope {
 public:
  explicit ReplayPrepareScope(CaptureKey key) : scope_(CapturePhase::kReplayPrepare, key) {}

 private:
  CaptureContext::Scope scope_;
};

}  // namespace kiln

#endif  // KILN_GRAPH_GRAPH_SET_H_
