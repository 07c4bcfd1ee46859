#include "attention/attention_params.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(AttentionParamsTest, CheckAttentionDtypeAcceptsBf16AndFp16) {
  EXPECT_TRUE(CheckAttentionDtype(AttentionDtype::kBf16, "Decode").ok());
  EXPECT_TRUE(CheckAttentionDtype(AttentionDtype::kFp16, "Decode").ok());
}

TEST(AttentionParamsTest, CheckAttentionDtypeNamesTheCallerTheValueAndTheWayOut) {
  const absl::Status s = CheckAttentionDtype(static_cast<AttentionDtype>(7), "KV layout");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "KV layout dtype 7 is not supported; use kBf16 (0) or kFp16 (1)");
  EXPECT_EQ(CheckAttentionDtype(static_cast<AttentionDtype>(-1), "Merge").message(),
            "Merge dtype -1 is not supported; use kBf16 (0) or kFp16 (1)");
}

}  // namespace
}  // namespace kiln
