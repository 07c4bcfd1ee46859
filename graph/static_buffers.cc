#include "graph/static_buffers.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

std::string Address(const void* p) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

}  // namespace

absl::Status StaticBuffers::Bind(absl::string_view name, void* address, size_t bytes,
                                 BufferRole role) {
  if (name.empty()) {
    return absl::InvalidArgumentError("Static buffer with an empty name; name every buffer");
  }
  if (address == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Static buffer '", name, "' at ", Address(address), " of ", bytes,
                     " bytes; bind an allocated buffer (non-null, at least one byte)"));
  }
  if (bytes - 1 > UINTPTR_MAX - reinterpret_cast<uintptr_t>(address)) {
    // [address, address + bytes) would wrap past the end of the address space: no allocation
    // is like that, and sums and ends computed from it would be wrong.
    return absl::InvalidArgumentError(
        absl::StrCat("Static buffer '", name, "' at ", Address(address), " of ", bytes,
                     " bytes runs past the end of the address space; bind the buffer's real "
                     "address and size"));
  }
  auto [it, inserted] = index_.try_emplace(std::string(name), entries_.size());
  if (inserted) {
    entries_.push_back(Entry{std::string(name), address, bytes, role});
  } else {
    Entry& entry = entries_[it->second];
    entry.address = address;
    entry.bytes = bytes;
    entry.role = role;
  }
  return absl::OkStatus();
}

const StaticBuffers::Entry* StaticBuffers::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

StaticBuffers::Snapshot StaticBuffers::Take() const {
  Snapshot snapshot;
  snapshot.items.reserve(entries_.size());
  for (const Entry& e : entries_) snapshot.items.push_back({e.address, e.bytes});
  return snapshot;
}

absl::Status StaticBuffers::CheckUnchanged(const Snapshot& snapshot, CaptureKey key) const {
  // Entries are never removed, so every index of this registry's snapshot exists; a snapshot
  // of another registry (or of this one before it was replaced) may hold more.
  const size_t n = snapshot.items.size();
  if (n > entries_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Static buffer snapshot of ", KeyName(key), " has ", n, " buffers but the registry has ",
        entries_.size(), "; it was taken from another registry (or this one was replaced): "
        "capture ", KeyName(key), " again"));
  }
  for (size_t i = 0; i < n; ++i) {
    const Entry& now = entries_[i];
    const Snapshot::Item& then = snapshot.items[i];
    if (now.address != then.address || now.bytes != then.bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Static buffer '", now.name, "' moved from ", Address(then.address), " (", then.bytes,
          " bytes) to ", Address(now.address), " (", now.bytes, " bytes) after ", KeyName(key),
          " was captured; the graph still uses the old place: keep the buffer in place or capture ",
          KeyName(key), " again"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
