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
using ::testing::Not;
using ::testing::StartsWith;

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

// A failed all-gather is never Unavailable, so no caller reads it as the agreement to fall back:
// a lost peer (the bootstrap's Unavailable) becomes Aborted and keeps the bootstrap's words;
// other codes are kept. Both follow ExchangeFailed, for the capture agreement's call.
TEST(CaptureAgreementTest, AFailedAllGatherIsNeverUnavailable) {
  const absl::Status gather_lost = absl::UnavailableError(
      "Bootstrap rank 0 lost rank 1 (connection closed); did that process exit?");
  const absl::Status lost = CaptureAgreementLost(0, gather_lost);
  EXPECT_EQ(lost.code(), absl::StatusCode::kAborted) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("lost rank 1 (connection closed)"));
  EXPECT_THAT(lost.message(), HasSubstr("could not agree on a captured call"));
  EXPECT_THAT(lost.message(), HasSubstr("recreate it on every rank"));
  EXPECT_THAT(
      std::string(lost.message()),
      StartsWith(std::string(ExchangeFailed(0, kCaptureAgreementCall, gather_lost).message())));
  EXPECT_THAT(std::string(lost.message()), StartsWith("Custom all-reduce on rank 0: exchange "
                                                      "'custom_allreduce.capture_agreement'"));
  // The bootstrap's sentence ends with its question mark; the next starts after a space.
  EXPECT_THAT(lost.message(), HasSubstr("did that process exit? The ranks could not agree"));
  EXPECT_THAT(lost.message(), Not(HasSubstr("?.")));
  const absl::Status late = CaptureAgreementLost(
      1, absl::DeadlineExceededError("Bootstrap rank 1: rank 0 did not answer within 5s"));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_THAT(late.message(), HasSubstr("rank 0 did not answer"));
  EXPECT_THAT(late.message(), HasSubstr("Custom all-reduce on rank 1"));
  // Words that end without a full stop get one before the next sentence.
  EXPECT_THAT(late.message(), HasSubstr("did not answer within 5s. The ranks could not agree"));
}

}  // namespace
}  // namespace internal
}  // namespace kiln
