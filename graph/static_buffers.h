// The registry of a step's static buffers: the device memory a CUDA graph reads and writes at
// addresses baked in at capture. The owner declares each buffer here and re-declares it whenever
// it moves or resizes it; GraphSet snapshots the registry at capture and, before each replay,
// compares in O(buffers) that every buffer is still where the graph expects it.
//
//   kiln::StaticBuffers buffers;
//   RETURN_IF_ERROR(buffers.Bind("input_ids", ids.data(), ids.size(), kiln::BufferRole::kInput));
//   RETURN_IF_ERROR(buffers.Bind("logits", logits.data(), logits.size(),
//                                kiln::BufferRole::kOutput));
//   RETURN_IF_ERROR(graphs.Capture(key, step, stream, &buffers));   // snapshots `buffers`
//   ...
//   logits = std::move(bigger_logits);                              // the owner moved it:
//   RETURN_IF_ERROR(buffers.Bind("logits", logits.data(), logits.size(),
//                                kiln::BufferRole::kOutput));
//   graphs.Replay(key, stream);   // FailedPrecondition naming 'logits': capture key again
//
// Entries keep their index for the registry's lifetime (re-declaring updates in place), so a
// snapshot is a plain array compared index by index. Host-only, no CUDA. Not thread-safe; may be
// read during capture.
#ifndef KILN_GRAPH_STATIC_BUFFERS_H_
#define KILN_GRAPH_STATIC_BUFFERS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "graph/capture_context.h"

namespace kiln {

// What a graph does with a static buffer.
enum class BufferRole {
  kInput,   // read by the graph (written by the host or an earlier step before replay)
  kOutput,  // written by the graph; verify-on-capture compares these bit for bit
};

class StaticBuffers {
 public:
  // One declared buffer. The registry does not own the memory.
  struct Entry {
    std::string name;
    void* address = nullptr;
    size_t bytes = 0;
    BufferRole role = BufferRole::kInput;
  };

  // The addresses and sizes of every entry at one moment (index i is entry i).
  struct Snapshot {
    struct Item {
      void* address;
      size_t bytes;
    };
    std::vector<Item> items;
  };

  // Declares buffer `name` at [address, address + bytes), or updates it when `name` exists (the
  // owner moved or resized it). InvalidArgument for an empty name, a null address, 0 bytes or a
  // range that runs past the end of the address space.
  absl::Status Bind(absl::string_view name, void* address, size_t bytes, BufferRole role);

  // Returns the entry named `name`, or nullptr. The pointer stays valid until the next Bind of
  // a new name.
  const Entry* Find(absl::string_view name) const;

  // Returns every entry, in declaration order.
  const std::vector<Entry>& entries() const { return entries_; }

  // Returns the current addresses and sizes.
  Snapshot Take() const;

  // Returns OK if every entry recorded in `snapshot` is still at its recorded address and size;
  // else FailedPrecondition naming the first buffer that moved, its old and new place, and `key`.
  // Entries declared after the snapshot are not part of that graph and are ignored; a snapshot
  // with more entries than the registry (taken from another one) is FailedPrecondition.
  // O(entries).
  absl::Status CheckUnchanged(const Snapshot& snapshot, CaptureKey key) const;

 private:
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace kiln

#endif  // KILN_GRAPH_STATIC_BUFFERS_H_
