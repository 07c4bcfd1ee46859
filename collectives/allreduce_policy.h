// Host-only choice between NCCL and the custom CUDA-IPC all-reduce (one-shot or two-shot), and
// where the custom kernel's peers read this rank's input. No CUDA: the whole policy is tested on
// machines without a GPU.
//
//   kiln::AllReduceRequest request;
//   request.bytes = count * kiln::DataTypeSize(dtype);
//   request.world_size = world;
//   request.in = in;  request.out = out;
//   request.capturing = capturing;                   // asked on every call, never cached
//   request.custom_available = custom != nullptr;    // P2P proved by a real IPC write
//   request.custom_max_bytes = custom->max_bytes();
//   kiln::AllReducePlan plan = kiln::SelectAllReduce(config, request);
//
// Rules: the custom all-reduce only for world sizes 2, 4, 6 and 8, sizes that are a positive
// multiple of 16 bytes and at most its buffer, and 16-byte-aligned in and out pointers; then
// one-shot up to the config's one-shot crossover, two-shot up to the two-shot crossover, NCCL
// beyond. Eager calls read from the staging buffer; under capture, two-shot reads registered
// inputs and one-shot does too when the config says so and the call is not in place.
// Every function here is pure and thread-safe.
#ifndef KILN_COLLECTIVES_ALLREDUCE_POLICY_H_
#define KILN_COLLECTIVES_ALLREDUCE_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "collectives/allreduce_config.pb.h"

namespace kiln {

// Which implementation runs a call.
enum class AllReduceAlgorithm {
  kNccl,
  kOneShot,  // every rank reads every peer's whole input and reduces it all
  kTwoShot,  // reduce-scatter (each rank reduces its shard) + all-gather of the shards
};

// Where peers read this rank's input from.
enum class AllReduceInput {
  kStaged,      // the kernel first copies the input into this rank's registered staging buffer
  kRegistered,  // peers read the caller's buffer itself, registered after capture (graphs only)
};

// Returns "nccl", "one-shot" or "two-shot".
const char* AllReduceAlgorithmName(AllReduceAlgorithm algorithm);

// Returns "staged" or "registered".
const char* AllReduceInputName(AllReduceInput input);

// The facts one call is decided on.
struct AllReduceRequest {
  size_t bytes = 0;
  int world_size = 0;
  const void* in = nullptr;
  const void* out = nullptr;
  bool capturing = false;         // the stream is being captured into a CUDA graph
  bool custom_available = false;  // the custom all-reduce exists and P2P was proved
  size_t custom_max_bytes = 0;    // its buffer limit
};

// The decision for one call.
struct AllReducePlan {
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kNccl;
  AllReduceInput input = AllReduceInput::kStaged;  // meaningful for the custom algorithms
};

// Returns true for the world sizes the custom kernels are built for (2, 4, 6, 8).
bool IsCustomWorldSize(int world_size);

// Returns true if [a, a + bytes) and [b, b + bytes) overlap.
bool BuffersOverlap(const void* a, const void* b, size_t bytes);

// Returns the one-shot / two-shot crossovers of `config` for `world_size` (0 for world sizes
// the custom kernels do not support).
int64_t OneShotMaxBytes(const AllReduceConfig& config, int world_size);
int64_t TwoShotMaxBytes(const AllReduceConfig& config, int world_size);

// The largest AllReduceConfig.buffer_bytes: each rank allocates 2 x buffer_bytes + 64 KiB and the
// kernels index world size x buffer_bytes bytes in 64 bits, which a value near 2^63 would wrap (a
// few KiB allocated for a buffer the kernels take to be huge). No GPU holds 2 TiB.
constexpr int64_t kMaxAllReduceBufferBytes = int64_t{1} << 40;

// The longest AllReduceConfig timeout in milliseconds: the kernels wait barrier_timeout_ms x 10^6
// nanoseconds in 64 bits, which a larger value would wrap into a short wait (spurious
// DeadlineExceeded).
constexpr int64_t kMaxAllReduceTimeoutMs = std::numeric_limits<int64_t>::max() / 1000000;

// The largest AllReduceConfig.max_graph_inputs: the device table takes 136 bytes per input
// (136 MiB here), and RegisterGraphBuffers sends 168 bytes per pending input through the host
// bootstrap, within HostBootstrap::kMaxMessageBytes.
constexpr int32_t kMaxAllReduceGraphInputs = int32_t{1} << 20;

// Returns InvalidArgument naming the first field out of range (buffer_bytes a positive multiple
// of 16 up to kMaxAllReduceBufferBytes, threads_per_block and min_threads_per_block multiples of
// 32 in 64..1024, max_blocks in 1..128, timeouts in 1..kMaxAllReduceTimeoutMs, max_graph_inputs
// in 1..kMaxAllReduceGraphInputs, crossovers not negative).
absl::Status ValidateAllReduceConfig(const AllReduceConfig& config);

// Returns whether the custom all-reduce may take `request` at all (eligibility only: world size,
// availability, size and alignment), regardless of the crossovers.
bool CustomAllReduceEligible(const AllReduceConfig& config, const AllReduceRequest& request);

// Returns where a custom call of `algorithm` reads its input from.
AllReduceInput ChooseAllReduceInput(const AllReduceConfig& config, AllReduceAlgorithm algorithm,
                                    const AllReduceRequest& request);

// Returns the plan for `request` under `config`.
AllReducePlan SelectAllReduce(const AllReduceConfig& config, const AllReduceRequest& request);

// Returns InvalidArgument naming the first part of `request` that the custom kernels cannot run
// with `plan`: an algorithm other than kOneShot or kTwoShot, bytes that are not a positive
// multiple of 16 at most custom_max_bytes (named with the call's `count` elements of
// `dtype_name`, e.g. DataTypeName's "bf16", that make them), an in or out pointer that is not
// 16-byte aligned, or a one-shot registered input that overlaps the output (peers would read
// what this rank overwrites). Reads neither `capturing` nor the world size. Every custom plan
// SelectAllReduce returns passes (allreduce_policy_test sweeps it), so a caller that planned
// with it need not ask again.
absl::Status CheckCustomAllReducePlan(const AllReducePlan& plan, const AllReduceRequest& request,
                                      size_t count, const char* dtype_name);

// The grid of one custom kernel launch.
struct CustomLaunchShape {
  int blocks = 1;
  int threads = 0;  // per block
};

// Returns the grid for a custom call of `bytes` (a positive multiple of 16) with `algorithm`
// (kOneShot or kTwoShot) on `world_size` ranks. Each thread takes one 16-byte pack per pass over
// the work (all packs for one-shot, a shard of ceil(packs / world_size) for two-shot); the
// threads are spread over as many blocks as max_blocks allows, cutting threads per block from
// threads_per_block down to min_threads_per_block (or threads_per_block, if smaller) first, and
// only then capping the blocks. Every rank computes the same shape (same config, same size).
// Fields of `config` out of ValidateAllReduceConfig's ranges are clamped into them, so the shape
// is always 1..128 blocks of a multiple of 32 in 64..1024 threads.
CustomLaunchShape ChooseCustomLaunchShape(const AllReduceConfig& config,
                                          AllReduceAlgorithm algorithm, size_t bytes,
                                          int world_size);

// The widest row the fused all-reduce + residual add + RMSNorm kernel takes (one block per row:
// up to 4 chunks of 1024 threads of 8 elements).
constexpr int64_t kFusedAddRmsNormMaxHidden = 32768;

// Returns whether a bf16 all-reduce of `tokens` rows of `hidden` elements, followed by the
// residual add and RMSNorm, runs as the fused custom one-shot kernel: exactly when
// SelectAllReduce would pick the one-shot kernel for its tokens * hidden * 2 bytes (custom
// available, world size, buffer, crossover) and hidden is a positive multiple of 8 of at most
// kFusedAddRmsNormMaxHidden. Depends on sizes only, never on pointers or the capture state, so
// every rank and every capture and replay get the same answer.
bool FusedAddRmsNormEligible(const AllReduceConfig& config, int world_size,
                             bool custom_available, size_t custom_max_bytes, int64_t tokens,
                             int64_t hidden);

}  // namespace kiln

#endif  // KILN_COLLECTIVES_ALLREDUCE_POLICY_H_
