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

#include <cstddef>
#include <memory>

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

}  // namespace testing
}  // namespace kiln

#endif  // KILN_COLLECTIVES_TESTING_RANK_RIG_H_
