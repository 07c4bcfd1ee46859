// Internal to //collectives:custom_allreduce: the device-side layout shared by the host class and
// the kernels, and the raw launchers (which return cudaError_t; the class turns them into
// absl::Status).
//
// Each rank owns one IPC region (cudaMalloc, shared with its peers through cudaIpcMemHandle):
//
//   [0, kProbeOffset)              barrier flags: uint64 [2 sets][kMaxBlocks][kMaxRanks]
//   [kProbeOffset, +kMaxRanks*16)  P2P probe slots, one per writing peer
//   [kStagingOffset, +2*half)      two alternating staging halves of `half` bytes each
//
// plus private device memory (AllReduceControl: the call counter), a device table of
// RegisteredInput entries (graph inputs), and host-mapped error words the host polls.
#ifndef KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_H_
#define KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kiln {
namespace internal {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 128;
constexpr size_t kFlagsBytes = 2 * kMaxBlocks * kMaxRanks * sizeof(uint64_t);  // 16 KiB
constexpr size_t kProbeOffset = kFlagsBytes;
constexpr size_t kStagingOffset = 64 * 1024;
static_assert(kProbeOffset + kMaxRanks * 16 <= kStagingOffset, "flags and probes overlap staging");

constexpr uint32_t kProbeMagic = 0x6b696c6eu;  // "kiln"

// Per-rank private state that survives between calls and graph replays. Zero at creation.
struct AllReduceControl {
  // Completed custom calls on this rank. Every rank makes the same sequence of calls, so the
  // counters agree across ranks: the counter picks the flag set and staging half (epoch & 1) and
  // the barrier values, and it never resets, so replaying a graph just continues the sequence.
  uint64_t epoch;
  uint32_t blocks_done;  // blocks of the current call that finished; the last one bumps epoch
  uint32_t aborted;      // set once a barrier timed out: later kernels return at once
};

// One captured call's inputs on every rank, filled by RegisterGraphBuffers. `ready` stays 0
// until then, and a kernel that finds it 0 touches no peer memory. `outs` holds every rank's
// output where the call was captured to gather into outputs (a two-shot call whose output every
// rank could export), else all null.
struct RegisteredInput {
  const void* ptrs[kMaxRanks];
  void* outs[kMaxRanks];
  uint64_t ready;
};

// Written by kernels into host-mapped memory; the host reads it without synchronizing.
struct DeviceErrorWords {
  int timed_out;          // 1 once a barrier wait exceeded its timeout (sticky)
  int timed_out_peer;     // the peer that did not arrive
  int timed_out_stage;    // which barrier of the call
  int unregistered;       // 1 when a replay met an unregistered graph input (cleared on read)
  int unregistered_slot;  // that input's table slot
  int padding[3];
};

// Everything one launch needs, passed by value (kernel parameter space).
struct CustomAllReduceArgs {
  const void* in;                         // this rank's input  [packs * 16 bytes]
  void* out;                              // this rank's output [packs * 16 bytes]
  char* regions[kMaxRanks];               // every rank's IPC region, indexed by rank
  const RegisteredInput* registered;      // graph path: this call's table entry; else null
  AllReduceControl* control;              // this rank's control block
  DeviceErrorWords* errors;               // host-mapped
  uint64_t packs;                         // 16-byte packs to reduce
  uint64_t half_bytes;                    // size of one staging half
  uint64_t timeout_ns;                    // barrier wait limit
  int rank;
  int slot;                               // table slot, for error messages
  int push_inputs;  // write inputs into the peers' staging (the caller checked they fit)
  int push_gather;  // two-shot: write reduced shards into the peers' staging
};

// Returns whether a call of `packs` may push its inputs into a staging half of `half_bytes`
// (see custom_allreduce_kernels.cuh: one-shot needs W * packs, two-shot 2 * W * shard).
// Compared by division, never by multiplying up: for any packs (even near 2^64) the products
// would wrap to a small number and "fit". False for a world size below 1.
inline bool PushedInputsFit(uint64_t packs, int world_size, bool two_shot, uint64_t half_bytes) {
  if (world_size < 1) return false;
  const uint64_t w = static_cast<uint64_t>(world_size);
  const uint64_t half_packs = half_bytes / 16;
  if (!two_shot) return packs <= half_packs / w;
  const uint64_t shard = packs / w + (packs % w != 0 ? 1 : 0);
  return shard <= half_packs / (2 * w);
}

enum class KernelDtype { kBf16, kFp16, kFp32 };

// Launches the one-shot (two_shot false) or two-shot kernel for `world_size` ranks, as a
// programmatic dependent of the stream's previous kernel when `programmatic` (it overlaps that
// kernel's tail and waits for it on the device before touching memory).
cudaError_t LaunchCustomAllReduce(const CustomAllReduceArgs& args, KernelDtype dtype,
                                  int world_size, bool two_shot, int blocks, int threads,
                                  bool programmatic, cudaStream_t stream);

// Per-dtype launchers (one .cu file each so the instantiations build in parallel).
cudaError_t LaunchCustomAllReduceBf16(const CustomAllReduceArgs& args, int world_size,
                                      bool two_shot, int blocks, int threads, bool programmatic,
                                      cudaStream_t stream);
cudaError_t LaunchCustomAllReduceFp16(const CustomAllReduceArgs& args, int world_size,
                                      bool two_shot, int blocks, int threads, bool programmatic,
                                      cudaStream_t stream);
cudaError_t LaunchCustomAllReduceFp32(const CustomAllReduceArgs& args, int world_size,
                                      bool two_shot, int blocks, int threads, bool programmatic,
                                      cudaStream_t stream);

// Writes {kProbeMagic, rank, peer, nonce} into probe slot `rank` of every peer's region
// (including its own), through the IPC mappings: the real write that proves P2P.
cudaError_t LaunchP2pProbe(char* const* regions, int world_size, int rank, uint32_t nonce,
                           cudaStream_t stream);

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_H_
