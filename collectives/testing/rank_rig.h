// What a multi-GPU test body of the collectives sets up on each rank: an AutoCommunicator that
// must have its custom all-reduce (P2P over NVLink is expected on the hosts these tests run on)
// and a stream. gtest assertions: call inside RunOnEveryGpu's body under ASSERT_NO_FATAL_FAILURE.
//
//   kiln::testing::RunOnEveryGpu([&](kiln::testing::RankContext& ctx) {
//     kiln::testing::RankRig rig;
//     ASSERT_NO_FATAL_FAILURE(kiln::testing::MakeRig(ctx, config, &rig));
//     kiln::DeviceBuffer in = kiln::testing::AllocOrFail(bytes, "in");
//     ... rig.comm->AllReduce(in.data(), ..., rig.stream.get()) ...
//   });
#ifndef KILN_COLLECTIVES_TESTING_RANK_RIG_H_
#define KILN_COLLECTIVES_TESTING_RANK_RIG_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/allreduce_config.pb.h"
#include "collectives/auto_communicator.h"
#include "collectives/testing/multiprocess_test_util.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/stream.h"

namespace kiln {
namespace testing {

struct RankRig {
  std::unique_ptr<AutoCommunicator> comm;
  Stream stream;
};

// Makes this rank's device current and creates the communicator (with `config`) and a stream;
// a fatal test failure when either fails or the custom all-reduce is unavailable.
void MakeRig(RankContext& ctx, const AllReduceConfig& config, RankRig* rig);

// Returns a device buffer of `bytes` named `name`, or an empty one after a test failure.
DeviceBuffer AllocOrFail(size_t bytes, const char* name);

// Returns a seed drawn on rank 0 and broadcast: the same on every rank (0 after a test failure).
// The broadcast is the bootstrap call "rank_rig.shared_seed" at every call: two calls in a row
// pair by their order alone, so a rank that skips one is caught only later (host_bootstrap.h).
// No number in the name would help: one counted on this rank advances only with its own calls.
uint64_t SharedSeed(RankContext& ctx);

// Returns how many ranks' `bytes` bytes at `data` differ from rank 0's (compared by an FNV-1a
// hash gathered from every rank); a test failure when the exchange fails. The all-gather is the
// bootstrap call "rank_rig.ranks_disagreeing" at every call, as SharedSeed's is one name.
int RanksDisagreeing(RankContext& ctx, const void* data, size_t bytes);
template <typename T>
int RanksDisagreeing(RankContext& ctx, const std::vector<T>& v) {
  return RanksDisagreeing(ctx, v.data(), v.size() * sizeof(T));
}

// Copies `bytes` host bytes to device `dst` on `stream` and waits for them; a fatal test failure
// on error.
void UploadBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);
template <typename T>
void Upload(void* dst, const std::vector<T>& src, cudaStream_t stream) {
  UploadBytes(dst, src.data(), src.size() * sizeof(T), stream);
}

// Waits for `stream`, then returns `count` elements of T copied from device `src`; a test
// failure on error.
void DownloadBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);
template <typename T>
std::vector<T> Download(const void* src, size_t count, cudaStream_t stream) {
  std::vector<T> out(count);
  DownloadBytes(out.data(), src, count * sizeof(T), stream);
  return out;
}

// Fills `bytes` of device memory at `p` with all-ones bytes on `stream` (NaN in every float
// dtype, so an element a kernel does not write can never pass); a fatal test failure on error.
void Poison(void* p, size_t bytes, cudaStream_t stream);

}  // namespace testing
}  // namespace kiln

#endif  // KILN_COLLECTIVES_TESTING_RANK_RIG_H_
