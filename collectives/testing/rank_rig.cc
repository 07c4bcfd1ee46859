#include "collectives/testing/rank_rig.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "gtest/gtest.h"

namespace kiln {
namespace testing {

void MakeRig(RankContext& ctx, const AllReduceConfig& config, RankRig* rig) {
  ASSERT_EQ(cudaSetDevice(ctx.device()), cudaSuccess);
  auto comm = AutoCommunicator::Create(ctx.bootstrap, ctx.device(), config);
  ASSERT_TRUE(comm.ok()) << comm.status();
  rig->comm = std::move(comm).value();
  ASSERT_TRUE(rig->comm->custom_available())
      << "P2P over NVLink is expected on these hosts: " << rig->comm->custom_unavailable_reason();
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  rig->stream = std::move(stream).value();
}

DeviceBuffer AllocOrFail(size_t bytes, const char* name) {
  auto b = DeviceBuffer::Allocate(bytes, name);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : DeviceBuffer();
}

}  // namespace testing
}  // namespace kiln
