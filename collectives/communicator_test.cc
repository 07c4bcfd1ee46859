#include "collectives/communicator.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CommunicatorTest, DataTypeSizesAndNames) {
  EXPECT_EQ(DataTypeSize(DataType::kBf16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kFp16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kFp32), 4u);
  EXPECT_EQ(std::string(DataTypeName(DataType::kBf16)), "bf16");
  EXPECT_EQ(std::string(DataTypeName(DataType::kFp16)), "fp16");
  EXPECT_EQ(std::string(DataTypeName(DataType::kFp32)), "fp32");
}

TEST(CommunicatorTest, AllReduceArgsGiveTheBytes) {
  // Stand-ins for device pointers: the check never dereferences them.
  alignas(16) static char in[64], out[64];
  absl::StatusOr<size_t> bytes = CheckAllReduceArgs(in, out, 8, DataType::kBf16);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 16u);
  bytes = CheckAllReduceArgs(in, in, 8, DataType::kFp32);  // in place
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 32u);
  bytes = CheckAllReduceArgs(nullptr, nullptr, 0, DataType::kFp16);  // nothing to reduce
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 0u);
}

TEST(CommunicatorTest, AllReduceArgsRefuseADtypeOutsideTheEnum) {
  alignas(16) static char in[64], out[64];
  absl::StatusOr<size_t> bytes = CheckAllReduceArgs(in, out, 8, static_cast<DataType>(7));
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("dtype 7"));
}

TEST(CommunicatorTest, AllReduceArgsRefuseACountWhoseBytesWrap) {
  alignas(16) static char in[64], out[64];
  // 2^63 + 8 bf16 elements are 16 bytes once wrapped: a small, aligned, eligible-looking size.
  const size_t count = (size_t{1} << 63) + 8;
  absl::StatusOr<size_t> bytes = CheckAllReduceArgs(in, out, count, DataType::kBf16);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("overflows"));
  EXPECT_EQ(CheckAllReduceArgs(in, out, std::numeric_limits<size_t>::max(), DataType::kFp32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The largest count that fits is fine.
  EXPECT_TRUE(
      CheckAllReduceArgs(in, out, std::numeric_limits<size_t>::max() / 4, DataType::kFp32).ok());
}

TEST(CommunicatorTest, AllReduceArgsRefuseNullBuffers) {
  alignas(16) static char buffer[64];
  for (const auto& [in, out] : {std::pair<const void*, const void*>{nullptr, buffer},
                                {buffer, nullptr},
                                {nullptr, nullptr}}) {
    absl::StatusOr<size_t> bytes = CheckAllReduceArgs(in, out, 8, DataType::kBf16);
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("null buffer"));
  }
}

// A communicator whose only job is to show whether SynchronizeStream aborted it.
class RecordingCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  absl::Status AllReduce(const void*, void*, size_t, DataType, cudaStream_t) override {
    return absl::OkStatus();
  }
  absl::Status CheckAsyncErrors() override { return absl::OkStatus(); }
  bool aborted = false;

 protected:
  void AbortAfterTimeout(const absl::Status&) override { aborted = true; }
};

TEST(CommunicatorTest, SynchronizeStreamRefusesATimeoutThatIsNotPositive) {
  for (absl::Duration timeout :
       {absl::ZeroDuration(), absl::Milliseconds(-5), -absl::InfiniteDuration()}) {
    RecordingCommunicator comm;
    const absl::Status status = comm.SynchronizeStream(nullptr, timeout);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("must be positive")) << status;
    EXPECT_FALSE(comm.aborted);
  }
}

TEST(CommunicatorTest, AllReduceArgsSweepAnyCountDtypeAndPointers) {
  // Counts from 0 to 2^64 - 1, dtypes inside and outside the enum, null and non-null pointers:
  // the bytes exactly when count x element size fits size_t (checked in 128 bits here), else
  // InvalidArgument naming the value that is wrong, in the order dtype, size, pointers.
  std::mt19937_64 rng(21);
  alignas(16) static char buffer[64];
  const int dtypes[] = {0, 1, 2, -1, 3, 7, 1 << 30, std::numeric_limits<int>::min()};
  const size_t edges[] = {0,
                          1,
                          8,
                          std::numeric_limits<size_t>::max() / 4,
                          std::numeric_limits<size_t>::max() / 4 + 1,
                          std::numeric_limits<size_t>::max() / 2,
                          std::numeric_limits<size_t>::max() / 2 + 1,
                          size_t{1} << 62,
                          (size_t{1} << 63) + 8,
                          std::numeric_limits<size_t>::max()};
  int ok = 0;
  for (int i = 0; i < 100000; ++i) {
    const int raw_dtype = rng() % 3 == 0 ? dtypes[rng() % 8] : static_cast<int>(rng() % 3);
    const DataType dtype = static_cast<DataType>(raw_dtype);
    const size_t count =
        rng() % 2 == 0 ? edges[rng() % 10] : static_cast<size_t>(rng() >> (rng() % 64));
    const void* in = rng() % 5 == 0 ? nullptr : buffer;
    const void* out = rng() % 5 == 0 ? nullptr : buffer + 16;
    const absl::StatusOr<size_t> bytes = CheckAllReduceArgs(in, out, count, dtype);
    const size_t element = raw_dtype == 0 || raw_dtype == 1 ? 2 : raw_dtype == 2 ? 4 : 0;
    if (element == 0) {
      ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
      ASSERT_THAT(std::string(bytes.status().message()),
                  HasSubstr(absl::StrCat("dtype ", raw_dtype, " is not a DataType")));
      continue;
    }
    const unsigned __int128 want = static_cast<unsigned __int128>(count) * element;
    if (want > std::numeric_limits<size_t>::max()) {
      ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << count;
      ASSERT_THAT(std::string(bytes.status().message()),
                  HasSubstr(absl::StrCat(count, " ", DataTypeName(dtype), " elements overflows")));
      continue;
    }
    if (count > 0 && (in == nullptr || out == nullptr)) {
      ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
      ASSERT_THAT(std::string(bytes.status().message()), HasSubstr("got a null buffer"));
      continue;
    }
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_EQ(*bytes, static_cast<size_t>(want));
    ++ok;
  }
  EXPECT_GT(ok, 20000);
}

}  // namespace
}  // namespace kiln
