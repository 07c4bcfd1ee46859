// Testing: a name that a terminal would act on, for tests that every message naming a file or a
// tensor quotes it escaped on one clean line (Quoted, Escaped; runtime/config/quoted.h).
//
//   const std::string base = TempPath("");
//   ASSERT_TRUE(kiln::testing_internal::QuotedAsIs(base));
//   const std::string path = base + kiln::testing_internal::kOddName;
//   kiln::testing_internal::ExpectQuotedStatus(Open(path).status(), absl::StatusCode::kNotFound,
//                                              HasSubstr(kiln::testing_internal::kOddNameEscaped));
#ifndef KILN_RUNTIME_MODEL_INTERNAL_ODD_NAMES_H_
#define KILN_RUNTIME_MODEL_INTERNAL_ODD_NAMES_H_

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/quoted.h"

namespace kiln {
namespace testing_internal {

// A name holding an ESC (a terminal escape), a newline and U+009B (a terminal's CSI).
inline constexpr char kOddName[] = "odd\033[31m\n\302\2332J";
// kOddName as Quoted and Escaped write it.
inline constexpr char kOddNameEscaped[] = "odd\\x1b[31m\\n\\u009b2J";

// Returns success when Quoted writes `base` (a temporary directory) as it is: printable ASCII
// with no '"' and no '\\', so expected messages can hold it verbatim.
inline ::testing::AssertionResult QuotedAsIs(const std::string& base) {
  if (std::all_of(base.begin(), base.end(),
                  [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; })) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "the expected messages below take the temporary directory as Quoted writes it: "
         << base;
}

// Expects `status` to have `code` and a message that `message` matches, on one clean line.
inline void ExpectQuotedStatus(const absl::Status& status, absl::StatusCode code,
                               const ::testing::Matcher<std::string>& message) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), message);
  EXPECT_TRUE(IsOneCleanLine(status.message())) << absl::CHexEscape(status.message());
}

}  // namespace testing_internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_ODD_NAMES_H_
