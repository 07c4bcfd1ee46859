// Host tests of the rule for a failed bootstrap exchange of the custom all-reduce
// (exchange_failed.h). No GPU: it only maps one status to another.
#include "collectives/internal/exchange_failed.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace internal {
namespace {

using ::testing::HasSubstr;

// A lost peer is Aborted naming this rank, the call and the bootstrap's words; every other code
// stays, with the same context; none is ever Unavailable.
TEST(ExchangeFailedTest, ALostPeerIsAbortedAndOtherCodesStay) {
  const absl::Status lost = ExchangeFailed(
      2, "custom_allreduce.setup",
      absl::UnavailableError("Bootstrap rank 2 lost rank 0 (connection closed); did that process "
                             "exit?"));
  EXPECT_EQ(lost.code(), absl::StatusCode::kAborted) << lost;
  EXPECT_EQ(lost.message(),
            "Custom all-reduce on rank 2: exchange 'custom_allreduce.setup' with the other ranks "
            "failed: Bootstrap rank 2 lost rank 0 (connection closed); did that process exit?");
  for (const absl::StatusCode code :
       {absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kInternal,
        absl::StatusCode::kInvalidArgument, absl::StatusCode::kAborted}) {
    const absl::Status failed =
        ExchangeFailed(1, "custom_allreduce.config", absl::Status(code, "why"));
    EXPECT_EQ(failed.code(), code) << failed;
    EXPECT_EQ(failed.message(),
              "Custom all-reduce on rank 1: exchange 'custom_allreduce.config' with the other "
              "ranks failed: why");
  }
}

// The call's name is escaped as the bootstrap escapes names: control characters, a quote,
// bytes that are not UTF-8 and multi-byte characters (a C1 control, a bidi override, a line
// separator) come out as escapes, so the message stays one line of printable ASCII.
TEST(ExchangeFailedTest, TheCallsNameIsEscaped) {
  const absl::Status failed = ExchangeFailed(
      0, "a\nb'c\xff\xc2\x9b\xe2\x80\xae\xe2\x80\xa8", absl::InternalError("why"));
  const std::string message(failed.message());
  EXPECT_THAT(message,
              HasSubstr("exchange 'a\\nb\\'c\\xff\\xc2\\x9b\\xe2\\x80\\xae\\xe2\\x80\\xa8' with "
                        "the other ranks failed: why"));
  for (const char ch : message) {
    EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "byte " << static_cast<int>(ch) << " in " << message;
  }
}

}  // namespace
}  // namespace internal
}  // namespace kiln
