#include "collectives/communicator.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(CommunicatorTest, DataTypeSizesAndNames) {
  EXPECT_EQ(DataTypeSize(DataType::kBf16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kFp16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kFp32), 4u);
  EXPECT_EQ(std::string(DataTypeName(DataType::kBf16)), "bf16");
  EXPECT_EQ(std::string(DataTypeName(DataType::kFp16)), "fp16");
  EXPECT_EQ(std::string(DataTypeName(DataType::kFp32)), "fp32");
}

}  // namespace
}  // namespace kiln
