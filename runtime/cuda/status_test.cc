#include "runtime/cuda/status.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cublas_status.h"
#include "runtime/cuda/nccl_status.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(ToStatus(cudaSuccess, "x").ok());
  EXPECT_TRUE(ToStatus(CUDA_SUCCESS, "x").ok());
  EXPECT_TRUE(ToStatus(ncclSuccess, "x").ok());
  EXPECT_TRUE(ToStatus(CUBLAS_STATUS_SUCCESS, "x").ok());
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  absl::Status s = ToStatus(cudaErrorMemoryAllocation, "cudaMalloc(kv)");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaMalloc(kv)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorMemoryAllocation"));

  absl::Status d = ToStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  EXPECT_EQ(d.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));

  absl::Status b = ToStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtCreate");
  EXPECT_EQ(b.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(b.message()), HasSubstr("CUBLAS_STATUS_ALLOC_FAILED"));
}

TEST(CudaStatusTest, OtherErrorsAreInternalWithContextAndName) {
  absl::Status s = ToStatus(cudaErrorIllegalAddress, "decode kernel");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("decode kernel failed: cudaErrorIllegalAddress"));

  absl::Status d = ToStatus(CUDA_ERROR_ILLEGAL_ADDRESS, "cuLaunchKernel");
  EXPECT_EQ(d.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));

  absl::Status n = ToStatus(ncclSystemError, "ncclCommInitRank");
  EXPECT_EQ(n.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(n.message()), HasSubstr("ncclCommInitRank failed: ncclSystemError"));

  absl::Status b = ToStatus(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul");
  EXPECT_EQ(b.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(b.message()), HasSubstr("CUBLAS_STATUS_EXECUTION_FAILED"));
}

TEST(CudaStatusTest, UnknownDriverCodeNamesTheNumber) {
  absl::Status d = ToStatus(static_cast<CUresult>(123456), "cuSomething");
  EXPECT_EQ(d.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(d.message()), HasSubstr("CUresult 123456"));
  // The name itself, as documented: never null.
  EXPECT_STREQ(CuResultName(static_cast<CUresult>(123456)), "CUresult 123456");
  EXPECT_STREQ(CuResultName(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
}

TEST(CudaStatusTest, InvalidUsageIsInvalidArgument) {
  EXPECT_EQ(ToStatus(ncclInvalidArgument, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToStatus(CUBLAS_STATUS_NOT_SUPPORTED, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

absl::Status FailsWith(cudaError_t e) {
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

absl::StatusOr<int> Twice(absl::StatusOr<int> v) {
  ASSIGN_OR_RETURN(int x, std::move(v));
  return 2 * x;
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  EXPECT_TRUE(FailsWith(cudaSuccess).ok());
  absl::Status s = FailsWith(cudaErrorInvalidValue);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorInvalidValue"));
  EXPECT_EQ(Twice(21).value(), 42);
  EXPECT_EQ(Twice(absl::NotFoundError("gone")).status().code(), absl::StatusCode::kNotFound);
}


// Whether `text` is printable ASCII: one line, no terminal escape.
bool IsPrintableAscii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// Every cudaError_t the runtime may return and far past it (negative values and the int range's
// ends included): OK only for cudaSuccess, ResourceExhausted only for out of memory, Internal for
// the rest, each message naming the context and the error (by name where the runtime knows it,
// else by number), on one printable line. Needs no GPU: the names come from the runtime library.
TEST(CudaStatusTest, EveryRuntimeErrorValueMapsCleanly) {
  std::vector<int> values;
  for (int v = -100; v <= 1100; ++v) values.push_back(v);
  for (int v = 9990; v <= 10010; ++v) values.push_back(v);
  values.push_back(std::numeric_limits<int>::min());
  values.push_back(std::numeric_limits<int>::max());
  std::mt19937 rng(17);
  for (int i = 0; i < 5000; ++i) values.push_back(static_cast<int>(rng()));
  int named = 0;
  for (int v : values) {
    const cudaError_t error = static_cast<cudaError_t>(v);
    const absl::Status s = ToStatus(error, "cudaOp(x)");
    if (v == 0) {
      ASSERT_TRUE(s.ok());
      continue;
    }
    ASSERT_EQ(s.code(), v == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                                       : absl::StatusCode::kInternal)
        << v;
    const std::string message(s.message());
    ASSERT_TRUE(IsPrintableAscii(message)) << v << ": " << message;
    // The reference: the runtime's own name where it has one.
    const std::string name = cudaGetErrorName(error);
    if (name.rfind("cuda", 0) == 0) {
      ++named;
      ASSERT_EQ(message,
                absl::StrCat("cudaOp(x) failed: ", name, " (", cudaGetErrorString(error), ")"));
    } else {
      ASSERT_EQ(message, absl::StrCat("cudaOp(x) failed: cudaError_t ", v,
                                      " (an error code this CUDA runtime does not know)"));
    }
  }
  EXPECT_GT(named, 50);  // CUDA 12 and 13 name about 130 codes
}

// The same for the driver's CUresult, whose names come from kiln's own table.
TEST(CudaStatusTest, EveryDriverResultValueMapsCleanly) {
  std::vector<int> values;
  for (int v = -100; v <= 1100; ++v) values.push_back(v);
  values.push_back(std::numeric_limits<int>::min());
  values.push_back(std::numeric_limits<int>::max());
  std::mt19937 rng(18);
  for (int i = 0; i < 5000; ++i) values.push_back(static_cast<int>(rng()));
  for (int v : values) {
    const CUresult result = static_cast<CUresult>(v);
    const absl::Status s = ToStatus(result, "cuOp");
    if (v == 0) {
      ASSERT_TRUE(s.ok());
      continue;
    }
    ASSERT_EQ(s.code(), v == CUDA_ERROR_OUT_OF_MEMORY ? absl::StatusCode::kResourceExhausted
                                                      : absl::StatusCode::kInternal)
        << v;
    const std::string name = CuResultName(result);
    ASSERT_TRUE(name.rfind("CUDA_", 0) == 0 || name == absl::StrCat("CUresult ", v)) << name;
    ASSERT_EQ(std::string(s.message()), absl::StrCat("cuOp failed: ", name));
  }
}

// NCCL's and cuBLAS's codes, each value of their ranges and past them.
TEST(CudaStatusTest, EveryNcclAndCublasValueMapsCleanly) {
  for (int v = -50; v <= 50; ++v) {
    const absl::Status n = ToStatus(static_cast<ncclResult_t>(v), "ncclOp");
    if (v == ncclSuccess) {
      ASSERT_TRUE(n.ok());
    } else {
      ASSERT_FALSE(n.ok()) << v;
      ASSERT_THAT(std::string(n.message()), HasSubstr("ncclOp failed: ")) << v;
      ASSERT_TRUE(IsPrintableAscii(std::string(n.message()))) << n;
    }
  }
  for (int v = -50; v <= 50; ++v) {
    const absl::Status b = ToStatus(static_cast<cublasStatus_t>(v), "cublasOp");
    if (v == CUBLAS_STATUS_SUCCESS) {
      ASSERT_TRUE(b.ok());
    } else {
      ASSERT_FALSE(b.ok()) << v;
      ASSERT_THAT(std::string(b.message()), HasSubstr("cublasOp failed: CUBLAS_STATUS_")) << v;
    }
  }
}

// CuResultName's text for an unknown code is per thread: threads naming different codes at once
// each read back their own.
TEST(CudaStatusTest, UnknownDriverNamesArePerThread) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < 2000; ++i) {
        const int code = 100000 + t * 10000 + i;
        const char* name = CuResultName(static_cast<CUresult>(code));
        if (std::string(name) != absl::StrCat("CUresult ", code)) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}
}  // namespace
}  // namespace kiln
