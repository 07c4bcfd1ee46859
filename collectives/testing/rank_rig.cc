#include "collectives/testing/rank_rig.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
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

uint64_t SharedSeed(RankContext& ctx) {
  const uint64_t mine = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                        std::random_device{}();
  auto shared =
      ctx.bootstrap.Broadcast(absl::string_view(reinterpret_cast<const char*>(&mine), sizeof(mine)),
                              "rank_rig.shared_seed");
  EXPECT_TRUE(shared.ok()) << shared.status();
  uint64_t seed = 0;
  if (shared.ok() && shared->size() == sizeof(seed)) {
    std::memcpy(&seed, shared->data(), sizeof(seed));
  }
  return seed;
}

int RanksDisagreeing(RankContext& ctx, const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  const absl::string_view hash(reinterpret_cast<const char*>(&h), sizeof(h));
  auto all = ctx.bootstrap.AllGather(hash, "rank_rig.ranks_disagreeing");
  EXPECT_TRUE(all.ok()) << all.status();
  int differ = 0;
  if (all.ok()) {
    for (const std::string& s : *all) differ += s != (*all)[0];
  }
  return differ;
}

void UploadBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  ASSERT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
}

void DownloadBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

void Poison(void* p, size_t bytes, cudaStream_t stream) {
  ASSERT_EQ(cudaMemsetAsync(p, 0xFF, bytes, stream), cudaSuccess);
}

}  // namespace testing
}  // namespace kiln
