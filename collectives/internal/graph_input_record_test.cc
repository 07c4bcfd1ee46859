// Host tests of the graph-input record (graph_input_record.h): its wire form, the checks of a
// rank's whole registration message (counts, then length), and the checks of what a peer says
// about its buffers (size, alignment, offset + size within the exported allocation) before any of
// it is mapped. No GPU: the checks are plain arithmetic.
#include "collectives/internal/graph_input_record.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using u128 = unsigned __int128;

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

ExportedBuffer Buffer(uint64_t offset, uint64_t allocation_bytes, uint8_t handle_byte = 7) {
  ExportedBuffer b;
  std::memset(&b.handle, handle_byte, sizeof(b.handle));
  b.offset = offset;
  b.allocation_bytes = allocation_bytes;
  return b;
}

GraphInputRecord Record(uint64_t bytes, ExportedBuffer input, ExportedBuffer output = {}) {
  GraphInputRecord r;
  r.bytes = bytes;
  r.input = input;
  r.output = output;
  return r;
}

TEST(GraphInputRecordTest, RoundTripsThroughItsWireForm) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1000; ++i) {
    GraphInputRecord record;
    record.bytes = rng();
    for (ExportedBuffer* b : {&record.input, &record.output}) {
      for (size_t k = 0; k < sizeof(b->handle); ++k) {
        reinterpret_cast<char*>(&b->handle)[k] = static_cast<char>(rng());
      }
      b->offset = rng();
      b->allocation_bytes = rng();
    }
    std::string wire = "prefix";
    AppendGraphInputRecord(record, &wire);
    ASSERT_EQ(wire.size(), 6 + kGraphInputRecordBytes);
    const GraphInputRecord back = ReadGraphInputRecord(wire.data() + 6);
    EXPECT_EQ(back.bytes, record.bytes);
    for (auto [got, want] : {std::make_pair(&back.input, &record.input),
                             std::make_pair(&back.output, &record.output)}) {
      EXPECT_EQ(std::memcmp(&got->handle, &want->handle, sizeof(want->handle)), 0);
      EXPECT_EQ(got->offset, want->offset);
      EXPECT_EQ(got->allocation_bytes, want->allocation_bytes);
    }
  }
  EXPECT_EQ(kGraphInputRecordBytes, 168u);
}

// A registration message of `n` records from slot `first`; record i's call is 16 x (i + 1) bytes.
std::string Message(int32_t first, int32_t n) {
  std::string message;
  AppendGraphInputsHeader(first, n, &message);
  for (int32_t i = 0; i < n; ++i) {
    const uint64_t bytes = 16 * (static_cast<uint64_t>(i) + 1);
    AppendGraphInputRecord(Record(bytes, Buffer(16 * i, 1 << 20, static_cast<uint8_t>(i))),
                           &message);
  }
  return message;
}

TEST(GraphInputRecordTest, ReadsEveryRecordOfAMessageInPlace) {
  for (int32_t n : {0, 1, 5}) {
    const std::string message = Message(3, n);
    ASSERT_EQ(message.size(), kGraphInputsHeaderBytes + n * kGraphInputRecordBytes);
    EXPECT_TRUE(CheckGraphInputsMessage(0, 3, n, 1, message).ok());
    for (int32_t i = 0; i < n; ++i) {
      const GraphInputRecord record = ReadGraphInputRecord(message, i);
      EXPECT_EQ(record.bytes, 16 * (static_cast<uint64_t>(i) + 1));
      EXPECT_EQ(record.input.offset, 16 * static_cast<uint64_t>(i));
      EXPECT_EQ(reinterpret_cast<const uint8_t*>(&record.input.handle)[0], i);
    }
  }
  EXPECT_EQ(kGraphInputsHeaderBytes, 8u);
}

TEST(GraphInputRecordTest, RefusesAMessageOfOtherCountsNamingBothRanks) {
  const std::string theirs = Message(2, 4);
  for (auto [first, n] : {std::make_pair(2, 5), std::make_pair(3, 4), std::make_pair(0, 0)}) {
    const absl::Status s = CheckGraphInputsMessage(1, first, n, 3, theirs);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("Rank 1 has ", n, " captured all-reduce inputs from slot ",
                                       first, ", rank 3 has 4 from slot 2")));
  }
  // Too short for a header: read as no counts at all.
  const absl::Status s = CheckGraphInputsMessage(0, 0, 0, 2, std::string(7, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 has -1 from slot -1"));
}

TEST(GraphInputRecordTest, RefusesAMessageOfAnotherLengthAsAnotherBuild) {
  // Records of another build's size (144 bytes: no allocation sizes), and one byte more or less:
  // the counts agree, so the length is what names the cause.
  const int32_t n = 3;
  std::string other_build;
  AppendGraphInputsHeader(5, n, &other_build);
  other_build.append(n * 144, '\x01');
  const std::string right = Message(5, n);
  for (const std::string& message :
       {other_build, right + "x", right.substr(0, right.size() - 1)}) {
    const absl::Status s = CheckGraphInputsMessage(0, 5, n, 1, message);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("Rank 1 sent ", message.size(),
                                       " bytes for 3 graph inputs where rank 0 expects 8 + 3 x "
                                       "168 = 512")));
    EXPECT_THAT(std::string(s.message()), HasSubstr("different kiln builds"));
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("captured")));
  }
}

TEST(GraphInputRecordTest, AcceptsBuffersThatHoldTheCall) {
  EXPECT_TRUE(CheckGraphInputRecord(1, 0, Record(4096, Buffer(0, 4096)), 4096, false).ok());
  EXPECT_TRUE(CheckGraphInputRecord(1, 0, Record(4096, Buffer(512, 8192)), 4096, false).ok());
  // Ending exactly at the allocation's end.
  EXPECT_TRUE(
      CheckGraphInputRecord(3, 9, Record(16, Buffer(4080, 4096), Buffer(0, 16)), 16, true).ok());
}

TEST(GraphInputRecordTest, RefusesADifferentCallSizeNamingTheRankAndBoth) {
  const absl::Status s = CheckGraphInputRecord(3, 5, Record(2048, Buffer(0, 1 << 20)), 4096, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Rank 3 captured a 2048-byte all-reduce in graph input slot 5 where this "
                        "rank captured 4096 bytes"));
}

TEST(GraphInputRecordTest, RefusesAnOffsetThatIsNotAMultipleOf16) {
  const absl::Status s = CheckGraphInputRecord(2, 1, Record(64, Buffer(8, 1 << 20)), 64, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Rank 2's input of graph all-reduce slot 1 is at offset 8"));
}

TEST(GraphInputRecordTest, RefusesBuffersBeyondTheirAllocation) {
  struct Case {
    uint64_t offset, allocation, bytes;
  };
  const Case cases[] = {
      {0, 4080, 4096},        // allocation smaller than the call
      {16, 4096, 4096},       // ends 16 bytes past it
      {8192, 4096, 16},       // starts past it
      {kMax - 15, kMax, 32},  // offset + bytes wraps to 16, which would look small
      {kMax - 15, 32, 32},    // offset + bytes wraps, allocation small
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckGraphInputRecord(
        1, 4, Record(c.bytes, Buffer(c.offset, c.allocation)), c.bytes, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("Rank 1's input of graph all-reduce slot 4 is at offset ",
                                       c.offset, " of a ", c.allocation, "-byte allocation")))
        << s;
  }
}

TEST(GraphInputRecordTest, ChecksTheOutputOnlyWhenTheCallGathersIntoOutputs) {
  const GraphInputRecord record = Record(4096, Buffer(0, 4096), Buffer(64, 4096));
  EXPECT_TRUE(CheckGraphInputRecord(1, 2, record, 4096, false).ok());
  const absl::Status s = CheckGraphInputRecord(1, 2, record, 4096, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Rank 1's output of graph all-reduce slot 2 is at offset 64 of a "
                        "4096-byte allocation"));
}

TEST(GraphInputRecordSweepTest, AcceptsExactlyTheRecordsThatFit) {
  // Offsets, allocation sizes and call sizes anywhere in uint64 (edges near 2^64 included),
  // against the rule computed in 128 bits: the sizes agree, every checked offset is a multiple of
  // 16 and offset + bytes is at most the allocation. A refusal names the rank and the slot.
  std::mt19937_64 rng(12);
  const uint64_t edges[] = {0, 1, 15, 16, 4096, 1 << 20, kMax / 2, kMax - 15, kMax};
  auto pick = [&]() -> uint64_t {
    switch (rng() % 3) {
      case 0:
        return edges[rng() % 9];
      case 1:
        return rng();
      default:
        return rng() % (1 << 22) / 16 * 16;
    }
  };
  int accepted = 0, refused = 0;
  for (int i = 0; i < 100000; ++i) {
    const uint64_t bytes = rng() % 2 == 0 ? pick() : rng() % (1 << 20) / 16 * 16;
    GraphInputRecord record =
        Record(rng() % 8 == 0 ? pick() : bytes, Buffer(pick(), pick()), Buffer(pick(), pick()));
    if (rng() % 2 == 0) record.input.allocation_bytes = record.input.offset + bytes + rng() % 64;
    if (rng() % 2 == 0) record.output.allocation_bytes = record.output.offset + bytes;
    const bool has_output = rng() % 2 == 0;
    const int rank = static_cast<int>(rng() % 8);
    const int slot = static_cast<int>(rng() % 1000);
    auto fits = [&](const ExportedBuffer& b) {
      return b.offset % 16 == 0 &&
             static_cast<u128>(b.offset) + bytes <= static_cast<u128>(b.allocation_bytes);
    };
    const bool want =
        record.bytes == bytes && fits(record.input) && (!has_output || fits(record.output));
    const absl::Status got = CheckGraphInputRecord(rank, slot, record, bytes, has_output);
    ASSERT_EQ(got.ok(), want) << got << " bytes " << bytes << " offset " << record.input.offset
                              << " allocation " << record.input.allocation_bytes;
    if (want) {
      ++accepted;
      continue;
    }
    ++refused;
    ASSERT_THAT(std::string(got.message()), HasSubstr(absl::StrCat("Rank ", rank)));
    ASSERT_THAT(std::string(got.message()), HasSubstr(absl::StrCat("slot ", slot)));
  }
  EXPECT_GT(accepted, 5000);
  EXPECT_GT(refused, 5000);
}

// Every rank exported its input: OK, and whether every output was exported too.
TEST(CaptureAgreementTest, EveryRankExportedItsInput) {
  bool every_output = false;
  const std::vector<std::string> all = {CaptureAgreementMessage(absl::OkStatus(), true, 3),
                                        CaptureAgreementMessage(absl::OkStatus(), true, 3)};
  ASSERT_TRUE(CheckCaptureAgreement(0, 3, all, &every_output).ok());
  EXPECT_TRUE(every_output);
  const std::vector<std::string> one_output = {
      CaptureAgreementMessage(absl::OkStatus(), true, 3),
      CaptureAgreementMessage(absl::OkStatus(), false, 3)};
  ASSERT_TRUE(CheckCaptureAgreement(0, 3, one_output, &every_output).ok());
  EXPECT_FALSE(every_output);
}

// A rank that could not export its input: Unavailable (the code the caller falls back on),
// naming the rank and its reason.
TEST(CaptureAgreementTest, ARankThatCouldNotExportItsInputIsUnavailable) {
  bool every_output = true;
  const std::vector<std::string> all = {
      CaptureAgreementMessage(absl::OkStatus(), true, 0),
      CaptureAgreementMessage(absl::InternalError("cudaIpcGetMemHandle failed"), false, 0)};
  const absl::Status status = CheckCaptureAgreement(0, 0, all, &every_output);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("Rank 1 could not register"));
  EXPECT_THAT(status.message(), HasSubstr("cudaIpcGetMemHandle failed"));
}

// A rank at another call, or a message too short to hold a slot: FailedPrecondition.
TEST(CaptureAgreementTest, ARankAtAnotherSlotIsFailedPrecondition) {
  bool every_output = false;
  const std::vector<std::string> all = {CaptureAgreementMessage(absl::OkStatus(), true, 2),
                                        CaptureAgreementMessage(absl::OkStatus(), true, 5)};
  const absl::Status status = CheckCaptureAgreement(0, 2, all, &every_output);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 1 is at #5"));
  const std::vector<std::string> short_message = {
      CaptureAgreementMessage(absl::OkStatus(), true, 2), "1"};
  EXPECT_EQ(CheckCaptureAgreement(0, 2, short_message, &every_output).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace internal
}  // namespace kiln
