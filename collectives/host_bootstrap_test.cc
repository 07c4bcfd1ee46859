#include "collectives/host_bootstrap.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {

// Reaches HostBootstrap's private testing knob (it is a friend of HostBootstrap).
class HostBootstrapTestPeer {
 public:
  // Sets how long rank 0 waits for room in full connections to report a call-name mismatch.
  static void SetReportWait(HostBootstrap& bootstrap, absl::Duration wait) {
    bootstrap.report_wait_ = wait;
  }
};

namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Connected star of `world` bootstraps (in-process; each is used by its own thread).
std::vector<std::unique_ptr<HostBootstrap>> MakeStar(int world, absl::Duration timeout) {
  std::vector<std::vector<int>> fds(world);
  for (int i = 1; i < world; ++i) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fds[0].push_back(sv[0]);
    fds[i].push_back(sv[1]);
  }
  std::vector<std::unique_ptr<HostBootstrap>> out;
  for (int r = 0; r < world; ++r) {
    auto b = HostBootstrap::FromConnectedSockets(r, world, fds[r], timeout);
    EXPECT_TRUE(b.ok()) << b.status();
    out.push_back(std::move(b).value());
  }
  return out;
}

// An abstract socket name, unique to this process.
std::string TempPath(const std::string& name) {
  return absl::StrCat("@kiln_bootstrap_test_", name, "_", getpid());
}

TEST(HostBootstrapTest, AllGatherBroadcastBarrierAndAgreeOverSocketPairs) {
  constexpr int kWorld = 3;
  auto star = MakeStar(kWorld, absl::Seconds(10));
  std::vector<std::vector<std::string>> gathered(kWorld);
  std::vector<std::string> broadcast(kWorld);
  std::vector<int> agreed(kWorld, -1), disagreed(kWorld, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      HostBootstrap& b = *star[r];
      // Different lengths per rank, one of them empty, one large.
      std::string mine = r == 1 ? "" : std::string(r == 2 ? 300000 : 3, static_cast<char>('a' + r));
      auto all = b.AllGather(mine);
      ASSERT_TRUE(all.ok()) << all.status();
      gathered[r] = *all;
      auto value = b.Broadcast(r == 0 ? "from rank zero" : "ignored");
      ASSERT_TRUE(value.ok()) << value.status();
      broadcast[r] = *value;
      ASSERT_TRUE(b.Barrier().ok());
      auto yes = b.AllAgree(true);
      ASSERT_TRUE(yes.ok());
      agreed[r] = *yes;
      auto no = b.AllAgree(r != 2);
      ASSERT_TRUE(no.ok());
      disagreed[r] = *no;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(gathered[r], ElementsAre("aaa", "", std::string(300000, 'c'))) << "rank " << r;
    EXPECT_EQ(broadcast[r], "from rank zero");
    EXPECT_EQ(agreed[r], 1);
    EXPECT_EQ(disagreed[r], 0);
  }
}

TEST(HostBootstrapTest, RendezvousAtASocketPath) {
  constexpr int kWorld = 4;
  const std::string path = absl::StrCat("/tmp/kiln_bootstrap_", getpid(), ".sock");
  std::vector<std::vector<std::string>> gathered(kWorld);
  std::vector<std::thread> threads;
  for (int r = kWorld - 1; r >= 0; --r) {  // rank 0 last: the others must retry
    threads.emplace_back([&, r] {
      auto b = HostBootstrap::Rendezvous(path, r, kWorld, absl::Seconds(10));
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ((*b)->rank(), r);
      EXPECT_EQ((*b)->world_size(), kWorld);
      auto all = (*b)->AllGather(absl::StrCat("rank", r));
      ASSERT_TRUE(all.ok()) << all.status();
      gathered[r] = *all;
      ASSERT_TRUE((*b)->Barrier().ok());
    });
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(gathered[r], ElementsAre("rank0", "rank1", "rank2", "rank3"));
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "rank 0 should remove the socket file";
}

TEST(HostBootstrapTest, MissingPeerAtRendezvousIsDeadlineExceeded) {
  const absl::Time start = absl::Now();
  auto b = HostBootstrap::Rendezvous(TempPath("missing"), 0, 2, absl::Milliseconds(200));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("Only 1 of 2 ranks joined"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  auto follower = HostBootstrap::Rendezvous(TempPath("nobody"), 1, 2, absl::Milliseconds(200));
  EXPECT_EQ(follower.status().code(), absl::StatusCode::kDeadlineExceeded) << follower.status();
}

TEST(HostBootstrapTest, StuckPeerIsDeadlineExceededAndTheErrorSticks) {
  auto star = MakeStar(2, absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  auto all = star[0]->AllGather("x");  // rank 1 never calls
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDeadlineExceeded) << all.status();
  EXPECT_THAT(std::string(all.status().message()), HasSubstr("rank 1 did not answer"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(star[0]->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(HostBootstrapTest, ExitedPeerIsUnavailableAtOnce) {
  auto star = MakeStar(3, absl::Seconds(30));
  star[2].reset();  // rank 2's process "exits": its socket closes
  const absl::Time start = absl::Now();
  std::thread rank1([&] { star[1]->AllGather("b").IgnoreError(); });
  auto all = star[0]->AllGather("a");
  rank1.join();  // rank 0 shut its connections on the error, so rank 1 returns at once
  EXPECT_EQ(all.status().code(), absl::StatusCode::kUnavailable) << all.status();
  EXPECT_THAT(std::string(all.status().message()), HasSubstr("lost rank 2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(HostBootstrapTest, MismatchedWorldSizesAreRefusedOnEveryRank) {
  // Rank 1 believes in a world of 3, rank 0 in one of 2. Rank 1's Rendezvous used to succeed and
  // its first exchange to fail with "lost rank 0 ... did that process exit?".
  const std::string path = TempPath("mismatch");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> joiner;
  std::thread rank1([&] { joiner = HostBootstrap::Rendezvous(path, 1, 3, absl::Seconds(10)); });
  auto root = HostBootstrap::Rendezvous(path, 0, 2, absl::Seconds(10));
  rank1.join();
  EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument) << root.status();
  EXPECT_THAT(std::string(root.status().message()), HasSubstr("as rank 1 of 3"));
  EXPECT_EQ(joiner.status().code(), absl::StatusCode::kInvalidArgument) << joiner.status();
  EXPECT_THAT(std::string(joiner.status().message()),
              HasSubstr("Rank 0 refused: A process joined the bootstrap at " + path +
                        " as rank 1 of 3, which does not fit world size 2"));
}

TEST(HostBootstrapTest, ATakenRankIsRefusedAndTheRanksThatJoinedLearnIt) {
  // Two processes both claim rank 1 of 3: whichever comes second is refused, the other one was
  // accepted and learns that the rendezvous failed.
  const std::string path = TempPath("taken");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> claims[2];
  std::thread root([&] {
    EXPECT_EQ(HostBootstrap::Rendezvous(path, 0, 3, absl::Seconds(10)).status().code(),
              absl::StatusCode::kInvalidArgument);
  });
  std::thread a([&] { claims[0] = HostBootstrap::Rendezvous(path, 1, 3, absl::Seconds(10)); });
  claims[1] = HostBootstrap::Rendezvous(path, 1, 3, absl::Seconds(10));
  a.join();
  root.join();
  const int refused = claims[0].status().code() == absl::StatusCode::kInvalidArgument ? 0 : 1;
  const absl::Status& refusal = claims[refused].status();
  const absl::Status& accepted = claims[1 - refused].status();
  EXPECT_EQ(refusal.code(), absl::StatusCode::kInvalidArgument) << refusal;
  EXPECT_THAT(std::string(refusal.message()), HasSubstr("or is taken"));
  EXPECT_EQ(accepted.code(), absl::StatusCode::kUnavailable) << accepted;
  EXPECT_THAT(std::string(accepted.message()),
              HasSubstr("ended the rendezvous before every rank joined"));
}

TEST(HostBootstrapTest, AJoinedRankWaitsForTheOthersWithinItsTimeout) {
  // Rank 0 and rank 1 of 3; rank 2 never comes.
  const std::string path = TempPath("incomplete");
  std::thread root([&] {
    EXPECT_EQ(HostBootstrap::Rendezvous(path, 0, 3, absl::Milliseconds(400)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  });
  auto joined = HostBootstrap::Rendezvous(path, 1, 3, absl::Milliseconds(300));
  root.join();
  EXPECT_FALSE(joined.ok());
  EXPECT_TRUE(joined.status().code() == absl::StatusCode::kDeadlineExceeded ||
              joined.status().code() == absl::StatusCode::kUnavailable)
      << joined.status();
}

// CPU time this thread has used.
absl::Duration ThreadCpuTime() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return absl::DurationFromTimespec(t);
}

TEST(HostBootstrapTest, LongAndInfiniteTimeoutsWaitWithoutSpinning) {
  // Timeouts of 2^31 ms and more used to wrap in poll's int argument: the infinite one spun
  // (poll(0) in a loop); 30 days became a negative wait, which blocks past the deadline (here the
  // peer answers, so that case only shows both still work).
  for (absl::Duration timeout : {absl::InfiniteDuration(), absl::Hours(24 * 30)}) {
    auto star = MakeStar(2, timeout);
    std::thread late([&] {
      absl::SleepFor(absl::Milliseconds(300));
      EXPECT_TRUE(star[1]->AllGather("b").ok());
    });
    const absl::Duration cpu_before = ThreadCpuTime();
    auto all = star[0]->AllGather("a");
    const absl::Duration cpu = ThreadCpuTime() - cpu_before;
    late.join();
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_THAT(*all, ElementsAre("a", "b"));
    EXPECT_LT(cpu, absl::Milliseconds(100)) << "rank 0 spun while waiting " << timeout;
  }
}

TEST(HostBootstrapTest, RejectsBadArguments) {
  EXPECT_EQ(HostBootstrap::FromConnectedSockets(2, 2, {}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostBootstrap::FromConnectedSockets(0, 3, {}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      HostBootstrap::Rendezvous(std::string(200, 'p'), 0, 2, absl::Seconds(1)).status().code(),
      absl::StatusCode::kInvalidArgument);
  auto single = HostBootstrap::Rendezvous(TempPath("single"), 0, 1, absl::Seconds(1));
  ASSERT_TRUE(single.ok()) << single.status();
  auto all = (*single)->AllGather("only");
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ElementsAre("only"));
}

// ---------------------------------------------------------------------------------------------
// Sweeps with random and adversarial input. The wire format is restated here (not included) so
// that the tests pin it: a frame is {uint32 magic, uint32 kind, uint64 sequence, uint64 size,
// uint64 call size}, `call size` bytes of the call's name (none for an unnamed call) and `size`
// payload bytes; kind 1 all-gather, 2 broadcast, 3 barrier, 4 agreement, with 0x100 on rank 0's
// replies (not on broadcasts); exchanges are numbered from 1 on every rank. A peer's named
// broadcast starts with an empty broadcast frame to rank 0 (its announcement). Rank 0's
// all-gather reply is world_size records of {uint64 size, bytes}. Kind 5 is rank 0's report, in
// place of a reply, that a peer made a call of another name: rank 0's call name, and as payload
// {int32 that peer's rank, uint32 rank 0's exchange kind, that peer's call name}. A rendezvous
// hello is {int32 magic, rank, world size}. Read as numbers, the magics' high three bytes are
// "kBf" (frame) and "kBo" (hello) and their low byte the protocol's version: "kBf3" and "kBo3"
// here (on the wire, little-endian, the version byte comes first). Any other version is another
// kiln build's, which this build refuses; the tests send versions '1' and '2'.

constexpr uint32_t kFrameMagic = 0x6b426633;
constexpr size_t kHeaderBytes = 32;
constexpr uint32_t kReplyBit = 0x100;
constexpr uint32_t kKindAllGather = 1, kKindBroadcast = 2, kKindBarrier = 3, kKindAgree = 4;
constexpr uint32_t kKindCallMismatch = 5;
constexpr int32_t kHelloMagic = 0x6b426f33;
// Other versions' magics, each with its text as the bootstrap quotes it.
struct OtherMagic {
  uint32_t magic;
  const char* text;
};
constexpr OtherMagic kOtherHelloMagics[] = {{0x6b426f31, "kBo1"}, {0x6b426f32, "kBo2"}};
constexpr OtherMagic kOtherFrameMagics[] = {{0x6b426631, "kBf1"}, {0x6b426632, "kBf2"}};

std::string Frame(uint32_t kind, uint64_t sequence, const std::string& payload,
                  const std::string& call = "") {
  std::string out(kHeaderBytes, '\0');
  const uint32_t magic = kFrameMagic;
  const uint64_t size = payload.size();
  const uint64_t call_size = call.size();
  std::memcpy(&out[0], &magic, 4);
  std::memcpy(&out[4], &kind, 4);
  std::memcpy(&out[8], &sequence, 8);
  std::memcpy(&out[16], &size, 8);
  std::memcpy(&out[24], &call_size, 8);
  return out + call + payload;
}

std::string Packed(const std::vector<std::string>& records) {
  std::string out;
  for (const std::string& r : records) {
    const uint64_t size = r.size();
    out.append(reinterpret_cast<const char*>(&size), 8);
    out += r;
  }
  return out;
}

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the bootstrap closed its end: what it read is what counts
    done += static_cast<size_t>(n);
  }
}

std::string RandomBytes(std::mt19937& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// A length from 0 up to 64 KiB, mostly short, some at the edges of a 64-KiB chunk.
size_t RandomLength(std::mt19937& rng) {
  switch (rng() % 6) {
    case 0:
      return 0;
    case 1:
      return 1 + rng() % 8;
    case 2:
      return 65536 + (rng() % 3) - 1;  // around the receiver's first chunk
    default:
      return rng() % 600;
  }
}

// One bootstrap of a world of `world` ranks whose only socket leads to a raw descriptor the test
// writes into: rank `rank` != 0 (the raw end plays rank 0), or rank 0 of a world of 2.
struct RawPeer {
  std::unique_ptr<HostBootstrap> bootstrap;
  int raw = -1;
  RawPeer() = default;
  RawPeer(RawPeer&& other) noexcept
      : bootstrap(std::move(other.bootstrap)), raw(std::exchange(other.raw, -1)) {}
  ~RawPeer() {
    if (raw >= 0) close(raw);
  }
};

RawPeer MakeRawPeer(int rank, int world, absl::Duration timeout) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  RawPeer peer;
  peer.raw = sv[1];
  auto b = HostBootstrap::FromConnectedSockets(rank, world, {sv[0]}, timeout);
  EXPECT_TRUE(b.ok()) << b.status();
  if (b.ok()) peer.bootstrap = std::move(b).value();
  return peer;
}

// What a correct bootstrap of rank `rank` of `world` must make of `stream` (all the raw peer
// wrote before shutting its writing side) as rank 0's all-gather reply to `mine`, decoded here
// independently of the library: the records, or the error code.
struct Verdict {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<std::string> records;
};

// The call is unnamed: a reply that names one is refused.
Verdict DecodeReply(const std::string& stream, int rank, int world, const std::string& mine) {
  Verdict v;
  // The magic is read first: a wrong one is refused without waiting for the rest of the header.
  if (stream.size() < 4) return {absl::StatusCode::kUnavailable, {}};
  uint32_t magic, kind;
  uint64_t sequence, size, call_size;
  std::memcpy(&magic, &stream[0], 4);
  if (magic != kFrameMagic) return {absl::StatusCode::kInternal, {}};
  if (stream.size() < kHeaderBytes) return {absl::StatusCode::kUnavailable, {}};
  std::memcpy(&kind, &stream[4], 4);
  std::memcpy(&sequence, &stream[8], 8);
  std::memcpy(&size, &stream[16], 8);
  std::memcpy(&call_size, &stream[24], 8);
  if (kind != (kKindAllGather | kReplyBit) || sequence != 1) {
    return {absl::StatusCode::kInternal, {}};
  }
  if (call_size > HostBootstrap::kMaxCallNameBytes) return {absl::StatusCode::kInternal, {}};
  if (stream.size() - kHeaderBytes < call_size) return {absl::StatusCode::kUnavailable, {}};
  if (call_size != 0) return {absl::StatusCode::kInternal, {}};
  const unsigned __int128 limit =
      static_cast<unsigned __int128>(world) * (8 + HostBootstrap::kMaxMessageBytes);
  if (size > limit) return {absl::StatusCode::kInternal, {}};
  if (stream.size() - kHeaderBytes < size) return {absl::StatusCode::kUnavailable, {}};
  const std::string payload = stream.substr(kHeaderBytes, size);
  unsigned __int128 pos = 0;  // wide: no wrap, whatever the sizes
  for (int r = 0; r < world; ++r) {
    if (pos + 8 > payload.size()) return {absl::StatusCode::kInternal, {}};
    uint64_t n;
    std::memcpy(&n, payload.data() + static_cast<size_t>(pos), 8);
    pos += 8;
    if (pos + n > payload.size()) return {absl::StatusCode::kInternal, {}};
    v.records.push_back(payload.substr(static_cast<size_t>(pos), n));
    pos += n;
  }
  if (pos != payload.size() || v.records[rank] != mine) return {absl::StatusCode::kInternal, {}};
  return v;
}

TEST(HostBootstrapSweepTest, RandomExchangesReturnEveryRanksBytesExactly) {
  // Worlds of 1 to 6 ranks (threads), each a random sequence of the four exchanges with random
  // byte strings (NULs, empty, around the receiver's 64 KiB chunk), named or not (random bytes
  // up to kMaxCallNameBytes, alike on every rank): every rank gets exactly the bytes every rank
  // brought, in rank order.
  std::mt19937 rng(20240611);
  int exchanges = 0, named = 0;
  for (int world = 1; world <= 6; ++world) {
    constexpr int kOps = 24;
    std::vector<int> ops(kOps);
    std::vector<std::string> calls(kOps);
    std::vector<std::vector<std::string>> data(kOps, std::vector<std::string>(world));
    std::vector<std::vector<bool>> votes(kOps, std::vector<bool>(world));
    for (int i = 0; i < kOps; ++i) {
      ops[i] = static_cast<int>(rng() % 4);
      switch (rng() % 3) {
        case 0:
          break;  // unnamed
        case 1:
          calls[i] =
              RandomBytes(rng, rng() % 2 == 0 ? HostBootstrap::kMaxCallNameBytes : 1 + rng() % 16);
          break;
        default:
          calls[i] = absl::StrCat("test.op", i);
      }
      named += !calls[i].empty();
      for (int r = 0; r < world; ++r) {
        data[i][r] = RandomBytes(rng, RandomLength(rng));
        votes[i][r] = rng() % 4 != 0;
      }
    }
    auto star = MakeStar(world, absl::Seconds(20));
    std::vector<std::vector<std::string>> failures(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        HostBootstrap& b = *star[r];
        auto fail = [&](int i, const std::string& what) {
          failures[r].push_back(absl::StrCat("world ", world, " op ", i, " rank ", r, ": ", what));
        };
        for (int i = 0; i < kOps; ++i) {
          switch (ops[i]) {
            case 0: {
              auto all = b.AllGather(data[i][r], calls[i]);
              if (!all.ok()) return fail(i, all.status().ToString());
              if (*all != data[i]) fail(i, "all-gather bytes differ");
              break;
            }
            case 1: {
              auto got = b.Broadcast(data[i][r], calls[i]);
              if (!got.ok()) return fail(i, got.status().ToString());
              if (*got != data[i][0]) fail(i, "broadcast bytes differ");
              break;
            }
            case 2: {
              absl::Status s = b.Barrier(calls[i]);
              if (!s.ok()) return fail(i, s.ToString());
              break;
            }
            default: {
              auto agreed = b.AllAgree(votes[i][r], calls[i]);
              if (!agreed.ok()) return fail(i, agreed.status().ToString());
              const bool want =
                  std::all_of(votes[i].begin(), votes[i].end(), [](bool v) { return v; });
              if (*agreed != want) fail(i, "agreement differs");
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) EXPECT_THAT(failures[r], ::testing::IsEmpty());
    exchanges += kOps;
  }
  EXPECT_EQ(exchanges, 6 * 24);
  // Named and unnamed calls both ran, many of each.
  EXPECT_GT(named, 6 * 24 / 3);
  EXPECT_LT(named, 6 * 24 - 6 * 24 / 6);
}

TEST(HostBootstrapSweepTest, RanksAtDifferentExchangesFailInsteadOfMisreading) {
  // Every rank runs the same random sequence except one rank, which makes a different call at
  // one step, then all end with a barrier. Every call that succeeds returns the right bytes; by
  // the final barrier every rank has an error (Internal naming the step where a frame of another
  // exchange arrived, Unavailable once a broken rank shut its connections, DeadlineExceeded where
  // both sides wait for each other), within the timeout; nothing hangs.
  std::mt19937 rng(777);
  constexpr absl::Duration kTimeout = absl::Milliseconds(100);
  int internal_errors = 0;
  for (int round = 0; round < 10; ++round) {
    const int world = 2 + static_cast<int>(rng() % 4);
    const int steps = 3 + static_cast<int>(rng() % 3);
    std::vector<int> ops(steps);
    for (int& op : ops) op = static_cast<int>(rng() % 4);
    const int odd_rank = static_cast<int>(rng() % world);
    const int odd_step = static_cast<int>(rng() % steps);
    const int odd_op = (ops[odd_step] + 1 + static_cast<int>(rng() % 3)) % 4;
    auto star = MakeStar(world, kTimeout);
    std::vector<absl::Status> last(world);
    std::vector<std::string> wrong(world);
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        HostBootstrap& b = *star[r];
        absl::Status status;
        for (int i = 0; i <= steps; ++i) {
          const int op = i == steps ? 2 : (r == odd_rank && i == odd_step ? odd_op : ops[i]);
          const std::string mine = absl::StrCat("r", r, "s", i);
          switch (op) {
            case 0: {
              auto all = b.AllGather(mine);
              status = all.status();
              if (all.ok()) {
                for (int p = 0; p < world; ++p) {
                  if ((*all)[p] != absl::StrCat("r", p, "s", i)) wrong[r] += " all-gather";
                }
              }
              break;
            }
            case 1: {
              auto got = b.Broadcast(mine);
              status = got.status();
              if (got.ok() && *got != absl::StrCat("r0s", i)) wrong[r] += " broadcast";
              break;
            }
            case 2:
              status = b.Barrier();
              break;
            default:
              status = b.AllAgree(true).status();
          }
        }
        last[r] = status;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "round " << round;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(wrong[r], "") << "round " << round << " rank " << r;
      EXPECT_THAT(last[r].code(),
                  AnyOf(absl::StatusCode::kInternal, absl::StatusCode::kUnavailable,
                        absl::StatusCode::kDeadlineExceeded))
          << "round " << round << " rank " << r << " (odd rank " << odd_rank << " step "
          << odd_step << "): " << last[r];
      if (absl::IsInternal(last[r])) {
        ++internal_errors;
        EXPECT_THAT(std::string(last[r].message()), HasSubstr("out of step")) << last[r];
      }
    }
  }
  EXPECT_GT(internal_errors, 0);
}

TEST(HostBootstrapSweepTest, MutatedAllGatherRepliesAreDecodedOrRefused) {
  // A raw peer plays rank 0 for rank r of a world of 2..9 and answers its all-gather with a reply
  // that is valid or mutated: a flipped byte, truncated, trailing bytes, a record size of 0,
  // +-1, 2^63 or 2^64 - 1, a record missing or extra, the frame size changed, another exchange's
  // kind or number, this rank's record altered. The bootstrap's answer is the one an independent
  // decoder gives (the records, or Internal for a malformed reply, Unavailable when the stream
  // ends early), and after an error every later call returns the same code at once.
  std::mt19937 rng(4242);
  int accepted = 0, refused = 0, ended = 0;
  for (int iteration = 0; iteration < 600; ++iteration) {
    const int world = 2 + static_cast<int>(rng() % 8);
    const int rank = 1 + static_cast<int>(rng() % (world - 1));
    std::vector<std::string> records(world);
    for (std::string& r : records) r = RandomBytes(rng, rng() % 5 == 0 ? 0 : rng() % 40);
    const std::string mine = records[rank];
    std::string payload = Packed(records);
    uint32_t kind = kKindAllGather | kReplyBit;
    uint64_t sequence = 1;
    const int mutation = static_cast<int>(rng() % 10);
    std::string stream;
    auto record_size_at = [&](int index) {  // byte offset of record `index`'s size field
      size_t pos = 0;
      for (int r = 0; r < index; ++r) pos += 8 + records[r].size();
      return pos;
    };
    switch (mutation) {
      case 1: {  // a size field of one record
        const int which = static_cast<int>(rng() % world);
        const uint64_t choices[] = {0,
                                    records[which].size() + 1,
                                    records[which].size() - (records[which].empty() ? 0 : 1),
                                    uint64_t{1} << 63,
                                    ~uint64_t{0},
                                    ~uint64_t{0} - 7,
                                    static_cast<uint64_t>(rng())};
        const uint64_t size = choices[rng() % 7];
        std::memcpy(&payload[record_size_at(which)], &size, 8);
        break;
      }
      case 2:  // a record missing
        payload = Packed(std::vector<std::string>(records.begin(), records.end() - 1));
        break;
      case 3: {  // a record extra
        std::vector<std::string> more = records;
        more.push_back(RandomBytes(rng, rng() % 8));
        payload = Packed(more);
        break;
      }
      case 4:  // this rank's own record altered (same length, when it has bytes)
        if (!mine.empty()) payload[record_size_at(rank) + 8] ^= 0x40;
        break;
      case 5:
        kind = (rng() % 2 == 0 ? kKindBroadcast : kKindAllGather) |
               (rng() % 2 == 0 ? 0 : kReplyBit);
        if (kind == (kKindAllGather | kReplyBit)) kind = kKindAgree | kReplyBit;
        break;
      case 6:
        sequence = rng() % 2 == 0 ? 0 : 2 + rng() % 5;
        break;
      default:
        break;
    }
    stream = Frame(kind, sequence, payload);
    switch (mutation) {
      case 7:  // the frame's size field
      {
        const uint64_t choices[] = {payload.size() + 1, payload.size() - 1, ~uint64_t{0},
                                    uint64_t{1} << 40, 0};
        const uint64_t size = choices[rng() % 5];
        std::memcpy(&stream[16], &size, 8);
        break;
      }
      case 8:  // truncated anywhere, header included
        stream.resize(rng() % stream.size());
        break;
      case 9:  // a byte flipped anywhere, or bytes after the frame
        if (rng() % 2 == 0) {
          stream[rng() % stream.size()] ^= static_cast<char>(1 + rng() % 255);
        } else {
          stream += RandomBytes(rng, 1 + rng() % 30);
        }
        break;
      default:
        break;
    }
    const Verdict want = DecodeReply(stream, rank, world, mine);
    RawPeer peer = MakeRawPeer(rank, world, absl::Seconds(5));
    ASSERT_NE(peer.bootstrap, nullptr);
    WriteAll(peer.raw, stream);
    shutdown(peer.raw, SHUT_WR);  // the bootstrap sees the end of what came
    const absl::Time start = absl::Now();
    auto got = peer.bootstrap->AllGather(mine);
    ASSERT_LT(absl::Now() - start, absl::Seconds(2)) << "iteration " << iteration;
    ASSERT_EQ(got.status().code(), want.code)
        << "iteration " << iteration << " mutation " << mutation << ": " << got.status();
    if (got.ok()) {
      ASSERT_EQ(*got, want.records) << "iteration " << iteration;
      ++accepted;
      continue;
    }
    const std::string message(got.status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("Bootstrap rank ", rank))) << message;
    if (want.code == absl::StatusCode::kInternal) {
      ++refused;
      EXPECT_THAT(message, AnyOf(HasSubstr("malformed"), HasSubstr("out of step"),
                                 HasSubstr("not a bootstrap frame"), HasSubstr("over the limit")))
          << message;
    } else {
      ++ended;
      EXPECT_THAT(message, HasSubstr("lost rank 0")) << message;
    }
    // Sticky: the next exchange fails the same way at once, whatever it is.
    EXPECT_EQ(peer.bootstrap->Barrier().code(), want.code);
    EXPECT_EQ(peer.bootstrap->Broadcast("x").status().code(), want.code);
  }
  // The sweep reached every outcome.
  EXPECT_GT(accepted, 60);
  EXPECT_GT(refused, 150);
  EXPECT_GT(ended, 30);
}

TEST(HostBootstrapSweepTest, MalformedFramesToRankZeroNameThePeer) {
  // Rank 0 of a world of 2..6 gathers from raw peers; one of them (random) sends a bad frame:
  // garbage, another exchange's kind or number, a size over the limit (up to 2^64 - 1, refused
  // before anything is allocated), a header cut short, a payload cut short (the peer then closes
  // or stays silent), a barrier or vote carrying bytes it should not, a call name where rank 0's
  // call is unnamed. Rank 0 names that peer, with Internal, Unavailable or DeadlineExceeded as
  // the case says, within its timeout.
  std::mt19937 rng(99);
  // Short: every good frame is written before the call, so only the hanging peer is waited for.
  constexpr absl::Duration kTimeout = absl::Milliseconds(30);
  int cases = 0;
  for (int iteration = 0; iteration < 160; ++iteration) {
    const int world = 2 + static_cast<int>(rng() % 5);
    const int bad = 1 + static_cast<int>(rng() % (world - 1));
    const int exchange = static_cast<int>(rng() % 3);  // all-gather, barrier, agreement
    const uint32_t kind =
        exchange == 0 ? kKindAllGather : exchange == 1 ? kKindBarrier : kKindAgree;
    const std::string good_payload = exchange == 0 ? "payload" : exchange == 1 ? "" : "1";
    std::vector<int> raw(world - 1), fds(world - 1);
    for (int i = 0; i < world - 1; ++i) {
      int sv[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
      fds[i] = sv[0];
      raw[i] = sv[1];
    }
    auto root = HostBootstrap::FromConnectedSockets(0, world, fds, kTimeout);
    ASSERT_TRUE(root.ok()) << root.status();
    absl::StatusCode want = absl::StatusCode::kInternal;
    std::string want_text;
    std::string bad_stream;
    bool close_after = true;
    const int variant = static_cast<int>(rng() % 10);
    switch (variant) {
      case 0:
        bad_stream = RandomBytes(rng, kHeaderBytes + rng() % 16);
        bad_stream[0] = static_cast<char>(~static_cast<uint8_t>(bad_stream[0] ^ 0x32));
        want_text = "not a bootstrap frame";
        break;
      case 1:
        bad_stream = Frame(kind == kKindAgree ? kKindBarrier : kKindAgree, 1, "");
        want_text = "out of step";
        break;
      case 2:
        bad_stream = Frame(kind, rng() % 2 == 0 ? 0 : 2 + rng() % 100, good_payload);
        want_text = "out of step";
        break;
      case 3: {
        bad_stream = Frame(kind, 1, "");
        const uint64_t choices[] = {HostBootstrap::kMaxMessageBytes + 1, uint64_t{1} << 40,
                                    ~uint64_t{0}, uint64_t{1} << 63};
        uint64_t size = choices[rng() % 4];
        if (exchange != 0) size = exchange == 1 ? 1 + rng() % 3 : 2 + rng() % 3;
        std::memcpy(&bad_stream[16], &size, 8);
        want_text = "over the limit";
        break;
      }
      case 4:  // header cut short, then the peer exits
        bad_stream = Frame(kind, 1, good_payload).substr(0, rng() % kHeaderBytes);
        want = absl::StatusCode::kUnavailable;
        want_text = "lost rank";
        break;
      case 5:  // header cut short, then the peer hangs
        bad_stream = Frame(kind, 1, good_payload).substr(0, rng() % kHeaderBytes);
        want = absl::StatusCode::kDeadlineExceeded;
        want_text = "did not answer";
        close_after = false;
        break;
      case 6: {  // payload cut short (exit or hang)
        bad_stream = Frame(kind, 1, "");
        const uint64_t size = 10 + rng() % 100;
        std::memcpy(&bad_stream[16], &size, 8);
        bad_stream += RandomBytes(rng, rng() % 10);
        close_after = rng() % 2 == 0;
        if (exchange != 0) {
          want_text = "over the limit";
        } else {
          want = close_after ? absl::StatusCode::kUnavailable : absl::StatusCode::kDeadlineExceeded;
          want_text = close_after ? "lost rank" : "did not answer";
        }
        break;
      }
      case 7:  // a vote that is not one
        if (exchange != 2) {
          bad_stream = Frame(kind, 1, "zz");
          want_text = exchange == 0 ? "" : "over the limit";
          if (exchange == 0) want = absl::StatusCode::kOk;  // any bytes make an all-gather
        } else {
          bad_stream = Frame(kind, 1, rng() % 2 == 0 ? "2" : std::string(1, '\0'));
          want_text = "agreement vote";
        }
        break;
      case 8:  // another call's name, with a control character
        bad_stream = Frame(kind, 1, good_payload, "other\ncall");
        want_text =
            absl::StrCat("rank 0 made an unnamed call but rank ", bad, " made call 'other\\ncall'");
        break;
      default:  // nothing at all: the peer exits
        want = absl::StatusCode::kUnavailable;
        want_text = "lost rank";
        break;
    }
    for (int i = 0; i < world - 1; ++i) {
      const int peer = i + 1;
      WriteAll(raw[i], peer == bad ? bad_stream : Frame(kind, 1, good_payload));
      if (peer == bad && close_after) shutdown(raw[i], SHUT_WR);
    }
    const absl::Time start = absl::Now();
    absl::Status status;
    if (exchange == 0) {
      status = (*root)->AllGather("root").status();
    } else if (exchange == 1) {
      status = (*root)->Barrier();
    } else {
      status = (*root)->AllAgree(true).status();
    }
    EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(1));
    EXPECT_EQ(status.code(), want) << "iteration " << iteration << " variant " << variant << ": "
                                   << status;
    if (want != absl::StatusCode::kOk) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(want_text)) << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("rank ", bad))) << status;
      // Every other raw peer sees its connection shut, at once, with no reply frame; except after
      // a bad vote, which only shows in the gathered reply: everyone gets that reply (and fails
      // on it too) before the connection shuts; and after another call's name, which rank 0
      // reports to every peer, the bad one included, before the connection shuts.
      const int32_t bad_rank = bad;
      const std::string report =
          Frame(kKindCallMismatch, 1,
                std::string(reinterpret_cast<const char*>(&bad_rank), 4) +
                    std::string(reinterpret_cast<const char*>(&kind), 4) + "other\ncall");
      for (int i = 0; i < world - 1 && !(variant == 7 && exchange == 2); ++i) {
        if (i + 1 == bad && variant != 8) continue;
        std::string got;
        char buffer[64];
        ssize_t n = 0;
        while ((n = recv(raw[i], buffer, sizeof(buffer), MSG_DONTWAIT)) > 0) {
          got.append(buffer, static_cast<size_t>(n));
        }
        EXPECT_EQ(n, 0) << "rank " << i + 1 << " was not told";
        EXPECT_EQ(got, variant == 8 ? report : "") << "rank " << i + 1;
      }
    }
    root->reset();
    for (int fd : raw) close(fd);
    ++cases;
  }
  EXPECT_EQ(cases, 160);
}

TEST(HostBootstrapSweepTest, OutOfRangeShapesTimeoutsAndPathsAreInvalidArgument) {
  // Random and extreme ranks and world sizes (INT_MIN..INT_MAX, around 0, 1 and kMaxWorldSize):
  // refused with the values named, before anything is allocated or any socket is made (a world
  // of INT_MAX used to reserve 8 GiB of socket slots on rank 0).
  std::mt19937 rng(5);
  const int edges[] = {INT_MIN, INT_MIN + 1, -2, -1, 0, 1, 2,
                       HostBootstrap::kMaxWorldSize - 1, HostBootstrap::kMaxWorldSize,
                       HostBootstrap::kMaxWorldSize + 1, INT_MAX - 1, INT_MAX};
  auto pick = [&]() {
    return rng() % 2 == 0 ? edges[rng() % 12] : static_cast<int>(rng());
  };
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    const int rank = pick(), world = pick();
    const bool valid =
        world >= 1 && world <= HostBootstrap::kMaxWorldSize && rank >= 0 && rank < world;
    if (valid) continue;  // valid shapes need peers; the exchanges sweep covers them
    ++refused;
    const std::string want = absl::StrCat("Rank ", rank, " of world size ", world,
                                          " is out of range");
    auto r = HostBootstrap::Rendezvous(TempPath("shape"), rank, world, absl::Milliseconds(50));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(want));
    auto f = HostBootstrap::FromConnectedSockets(rank, world, {}, absl::Seconds(1));
    ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(want));
  }
  EXPECT_GT(refused, 1000);

  // Timeouts that are not positive: a deadline already past would blame a healthy peer.
  for (absl::Duration t : {absl::ZeroDuration(), absl::Nanoseconds(-1), absl::Hours(-5),
                           -absl::InfiniteDuration()}) {
    auto r = HostBootstrap::Rendezvous(TempPath("timeout"), 0, 2, t);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("must be positive"));
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    auto f = HostBootstrap::FromConnectedSockets(1, 2, {sv[0]}, t);  // closes sv[0]
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    close(sv[1]);
    // Set on a working bootstrap, it fails the next exchange, names the value, and sticks.
    auto star = MakeStar(2, absl::Seconds(5));
    star[1]->set_timeout(t);
    absl::Status s = star[1]->Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::FormatDuration(t)));
    star[1]->set_timeout(absl::Seconds(5));
    EXPECT_EQ(star[1]->Barrier().code(), absl::StatusCode::kInvalidArgument);
    // Its peer is not left waiting: the broken rank shut its connection.
    EXPECT_EQ(star[0]->Barrier().code(), absl::StatusCode::kUnavailable);
  }

  // Socket counts and descriptors that do not fit.
  EXPECT_EQ(HostBootstrap::FromConnectedSockets(0, 2, {-1}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostBootstrap::FromConnectedSockets(1, 2, {}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Paths: empty, one byte too long, a NUL inside a file path (the kernel would bind the prefix).
  for (const std::string& path :
       {std::string(), std::string(108, 'p'), std::string("/tmp/kiln\0x.sock", 16)}) {
    auto r = HostBootstrap::Rendezvous(path, 0, 2, absl::Seconds(1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("Bootstrap socket path"));
  }
}

TEST(HostBootstrapSweepTest, AnOversizedMessageIsRefusedAndThePeersLearnAtOnce) {
  auto star = MakeStar(2, absl::Seconds(30));
  const std::string big(HostBootstrap::kMaxMessageBytes + 1, 'x');
  absl::Status root;
  std::thread rank0([&] { root = star[0]->AllGather("a").status(); });
  const absl::Time start = absl::Now();
  auto all = star[1]->AllGather(big);
  rank0.join();
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument) << all.status();
  EXPECT_THAT(std::string(all.status().message()),
              HasSubstr(absl::StrCat("cannot bring ", big.size(), " bytes")));
  EXPECT_EQ(root.code(), absl::StatusCode::kUnavailable) << root;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  auto lone = HostBootstrap::FromConnectedSockets(0, 1, {}, absl::Seconds(1));
  ASSERT_TRUE(lone.ok());
  EXPECT_EQ((*lone)->Broadcast(big).status().code(), absl::StatusCode::kInvalidArgument);
}

// Connects once to the abstract socket `path` as a process that is not (or not yet) a rank,
// waiting while the listener's backlog is full. Returns the connected descriptor, or -1 when no
// one listens there.
int ConnectOnce(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  addr.sun_path[0] = '\0';
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) return fd;
  close(fd);
  return -1;
}

// Three threads that connect to `path` without a word and without pause until Stop() (or the
// destructor), each keeping its latest `keep_open` connections open.
class SilentFlood {
 public:
  SilentFlood(const std::string& path, size_t keep_open) {
    for (int t = 0; t < 3; ++t) {
      threads_.emplace_back([this, path, keep_open] {
        std::deque<int> fds;
        while (!stop_.load()) {
          const int fd = ConnectOnce(path);
          if (fd < 0) {
            absl::SleepFor(absl::Milliseconds(1));  // not listening yet, or no more
            continue;
          }
          ++connected_;
          fds.push_back(fd);
          if (fds.size() > keep_open) {
            close(fds.front());
            fds.pop_front();
          }
        }
        for (int fd : fds) close(fd);
      });
    }
  }
  ~SilentFlood() { Stop(); }
  SilentFlood(const SilentFlood&) = delete;
  SilentFlood& operator=(const SilentFlood&) = delete;

  int connected() const { return connected_.load(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> connected_{0};
  std::vector<std::thread> threads_;
};

// ConnectOnce, retried until rank 0 listens. Returns the connected descriptor, or -1.
int ConnectRaw(const std::string& path) {
  for (int attempt = 0; attempt < 400; ++attempt) {
    const int fd = ConnectOnce(path);
    if (fd >= 0) return fd;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

TEST(HostBootstrapSweepTest, StrangersAtTheRendezvousAreDroppedAndTheRanksStillMeet) {
  // Before the real ranks come, processes connect to rank 0's socket and: close at once, send
  // part of an introduction and close, send an introduction without kiln's magic (random bytes).
  // Rank 0 drops each and the real ranks still meet.
  std::mt19937 rng(31);
  for (int round = 0; round < 6; ++round) {
    const int world = 2 + static_cast<int>(rng() % 3);
    const std::string path = TempPath(absl::StrCat("strangers", round));
    absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
    std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, world, absl::Seconds(10)); });
    for (int stranger = 0; stranger < 3; ++stranger) {
      const int fd = ConnectRaw(path);
      ASSERT_GE(fd, 0);
      std::string hello(12, '\0');
      const int32_t fields[3] = {kHelloMagic, 1, world};
      std::memcpy(&hello[0], fields, 12);
      switch ((stranger + round) % 3) {
        case 0:
          break;  // closes at once
        case 1:
          WriteAll(fd, hello.substr(0, 1 + rng() % 11));  // part of an introduction
          break;
        default:
          WriteAll(fd, RandomBytes(rng, 12 + rng() % 20));  // not kiln (magic almost surely off)
      }
      close(fd);
    }
    std::vector<absl::StatusOr<std::unique_ptr<HostBootstrap>>> others(world);
    std::vector<std::thread> threads;
    for (int r = 1; r < world; ++r) {
      threads.emplace_back(
          [&, r] { others[r] = HostBootstrap::Rendezvous(path, r, world, absl::Seconds(10)); });
    }
    for (auto& t : threads) t.join();
    rank0.join();
    ASSERT_TRUE(root.ok()) << root.status();
    std::vector<std::thread> gather;
    std::vector<std::vector<std::string>> got(world);
    for (int r = 0; r < world; ++r) {
      HostBootstrap* b = r == 0 ? root->get() : others[r]->get();
      ASSERT_NE(b, nullptr);
      gather.emplace_back([&, b, r] {
        auto all = b->AllGather(absl::StrCat(r));
        if (all.ok()) got[r] = *all;
      });
    }
    for (auto& t : gather) t.join();
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r].size(), static_cast<size_t>(world));
  }
}

// Returns what the peer of `fd` sent before it closed it (end of file or reset), or nullopt when
// it did not close it within `wait`.
std::optional<std::string> BytesBeforeClose(int fd, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  std::string got;
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) != 1) return std::nullopt;
    char bytes[4096];
    const ssize_t n = recv(fd, bytes, sizeof(bytes), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return got;
    got.append(bytes, static_cast<size_t>(n));
  }
}

// Returns whether the peer of `fd` closed it within `wait`.
bool ClosedByPeer(int fd, absl::Duration wait) { return BytesBeforeClose(fd, wait).has_value(); }

// What rank 0 sends a connection it pushes out while silent before it closes it: a verdict
// length of 0xffffffff, "connect again".
const std::string kConnectAgain(4, '\xff');

TEST(HostBootstrapSweepTest, SilentStrangersDoNotHoldUpTheRanks) {
  // Before the real ranks come, processes connect to rank 0's socket and stay connected without
  // a word, or after part of an introduction. Rank 0 reads all its connections at once, so the
  // ranks meet well before the 30-second deadline (a rank 0 that waited for the first
  // connection's introduction would wait all of it), and then it closes the strangers'.
  std::mt19937 rng(41);
  constexpr absl::Duration kTimeout = absl::Seconds(30);
  for (int round = 0; round < 4; ++round) {
    const int world = 2 + static_cast<int>(rng() % 3);
    const std::string path = TempPath(absl::StrCat("silent_strangers", round));
    const absl::Time start = absl::Now();
    std::vector<absl::StatusOr<std::unique_ptr<HostBootstrap>>> boots(world);
    std::thread rank0([&] { boots[0] = HostBootstrap::Rendezvous(path, 0, world, kTimeout); });
    std::vector<int> strangers;
    for (int i = 0; i < 1 + round; ++i) {
      const int fd = ConnectRaw(path);
      ASSERT_GE(fd, 0);
      if (i % 2 == 1) {
        const int32_t fields[3] = {kHelloMagic, 1, world};
        WriteAll(fd, std::string(reinterpret_cast<const char*>(fields), 1 + rng() % 11));
      }
      strangers.push_back(fd);
    }
    std::vector<std::thread> ranks;
    for (int r = 1; r < world; ++r) {
      ranks.emplace_back(
          [&, r] { boots[r] = HostBootstrap::Rendezvous(path, r, world, kTimeout); });
    }
    for (auto& t : ranks) t.join();
    rank0.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "round " << round;
    for (int r = 0; r < world; ++r) ASSERT_TRUE(boots[r].ok()) << "rank " << r << boots[r].status();
    std::vector<std::vector<std::string>> got(world);
    std::vector<std::thread> gather;
    for (int r = 0; r < world; ++r) {
      gather.emplace_back([&, r] {
        auto all = (*boots[r])->AllGather(absl::StrCat("rank", r));
        if (all.ok()) got[r] = *all;
      });
    }
    for (auto& t : gather) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(got[r].size(), static_cast<size_t>(world)) << "rank " << r;
      for (int p = 0; p < world; ++p) EXPECT_EQ(got[r][p], absl::StrCat("rank", p));
    }
    for (int fd : strangers) {
      EXPECT_TRUE(ClosedByPeer(fd, absl::Seconds(2))) << "rank 0 kept a stranger's connection";
      close(fd);
    }
  }
}

TEST(HostBootstrapSweepTest, AFloodOfSilentConnectionsIsBoundedAndTheRanksStillMeet) {
  // More silent connections than rank 0 keeps waiting (world size + 64): it pushes out the ones
  // that waited longest, telling each to connect again, and the ranks, which come last, still
  // meet at once. At the end it closes the rest without a word.
  constexpr int kWorld = 3;
  const std::string path = TempPath("flood");
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<std::unique_ptr<HostBootstrap>>> boots(kWorld);
  std::thread rank0(
      [&] { boots[0] = HostBootstrap::Rendezvous(path, 0, kWorld, absl::Seconds(30)); });
  std::vector<int> strangers;
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectRaw(path);
    ASSERT_GE(fd, 0);
    strangers.push_back(fd);
  }
  // The first ones were pushed out while the later ones kept coming.
  EXPECT_EQ(BytesBeforeClose(strangers[0], absl::Seconds(5)), kConnectAgain);
  std::vector<std::thread> ranks;
  for (int r = 1; r < kWorld; ++r) {
    ranks.emplace_back(
        [&, r] { boots[r] = HostBootstrap::Rendezvous(path, r, kWorld, absl::Seconds(30)); });
  }
  for (auto& t : ranks) t.join();
  rank0.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(boots[r].ok()) << "rank " << r << boots[r].status();
  int closed = 0, pushed_out = 0;
  for (int fd : strangers) {
    const std::optional<std::string> got = BytesBeforeClose(fd, absl::Seconds(2));
    closed += got.has_value();
    pushed_out += got == kConnectAgain;
    EXPECT_TRUE(!got.has_value() || got->empty() || *got == kConnectAgain);
    close(fd);
  }
  EXPECT_EQ(closed, 100);
  EXPECT_GE(pushed_out, 100 - (kWorld + 64));
}

TEST(HostBootstrapSweepTest, RanksStillMeetAmidAFloodOfSilentConnections) {
  // Threads connect to rank 0's socket without a word and without pause while the ranks join:
  // far more than world size + 64 connections, so many that one accept pass of rank 0 takes more
  // than that. A rank's introduction arrives amid them and may sit unread in its socket while
  // the pass goes on. Rank 0 pushes out only connections a poll() round found silent and that
  // have nothing to read, and a rank whose introduction had not even left when it was pushed out
  // connects again: every rank joins at once, instead of reading an early end while rank 0 waits
  // out its timeout.
  // The bound on how long the ranks take is half the deadline: generous for a sanitizer build on
  // two cores, and still far from a rank 0 that waits out its timeout.
  constexpr absl::Duration kTimeout = absl::Seconds(60);
  for (const int world : {2, 3, 8, 32}) {
    const std::string path = TempPath(absl::StrCat("flooded", world));
    const absl::Time start = absl::Now();
    std::vector<absl::StatusOr<std::unique_ptr<HostBootstrap>>> boots(world);
    std::thread rank0([&] { boots[0] = HostBootstrap::Rendezvous(path, 0, world, kTimeout); });
    SilentFlood flood(path, /*keep_open=*/500);
    while (flood.connected() < 10 * (world + 64) && absl::Now() - start < kTimeout) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    std::vector<std::thread> ranks;
    for (int r = 1; r < world; ++r) {
      ranks.emplace_back(
          [&, r] { boots[r] = HostBootstrap::Rendezvous(path, r, world, kTimeout); });
    }
    for (auto& t : ranks) t.join();
    rank0.join();
    const absl::Duration took = absl::Now() - start;
    flood.Stop();
    EXPECT_LT(took, kTimeout / 2) << "world " << world;
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(boots[r].ok()) << "world " << world << " rank " << r << " " << boots[r].status();
    }
    if (HasFailure()) return;
    std::vector<std::vector<std::string>> got(world);
    std::vector<std::thread> gather;
    for (int r = 0; r < world; ++r) {
      gather.emplace_back([&, r] {
        auto all = (*boots[r])->AllGather(absl::StrCat("rank", r));
        if (all.ok()) got[r] = *all;
      });
    }
    for (auto& t : gather) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(got[r].size(), static_cast<size_t>(world)) << "world " << world << " rank " << r;
      for (int p = 0; p < world; ++p) EXPECT_EQ(got[r][p], absl::StrCat("rank", p));
    }
  }
}

// Closes a descriptor (when not -1) as it goes out of scope, so an assertion that returns early
// leaks none.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }

 private:
  int fd_;
};

// Listens at the abstract socket `path`, as rank 0 does (the test plays it). Returns the
// listening descriptor, or -1.
int ListenAt(const std::string& path) {
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  addr.sun_path[0] = '\0';
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size())) != 0 ||
      listen(listener, 4) != 0) {
    close(listener);
    return -1;
  }
  return listener;
}

// Accepts a connection on `listener`, or returns -1 when none comes within `wait`: a rank that
// never connects fails the test with a message instead of hanging it.
int AcceptWithin(int listener, absl::Duration wait) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) != 1) return -1;
  return accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
}

// Returns the next `n` bytes from `fd`, or nullopt when they do not all arrive within `wait`
// (or the peer closes first).
std::optional<std::string> ReceiveWithin(int fd, size_t n, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  std::string got;
  while (got.size() < n) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) != 1) return std::nullopt;
    char bytes[64];
    const ssize_t r = recv(fd, bytes, std::min(sizeof(bytes), n - got.size()), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) return std::nullopt;
    got.append(bytes, static_cast<size_t>(r));
  }
  return got;
}

TEST(HostBootstrapTest, ARankPushedOutBeforeItsIntroductionConnectsAgain) {
  // The test plays rank 0 at the socket: it tells the rank's first connection to connect again
  // and closes it unread, as rank 0 does to a connection that looked silent while its rendezvous
  // was full. The rank connects again, introduces itself and joins.
  const std::string path = TempPath("pushed_out");
  const ScopedFd listener(ListenAt(path));
  ASSERT_GE(listener.get(), 0);
  absl::StatusOr<std::unique_ptr<HostBootstrap>> rank1;
  std::thread joiner([&] { rank1 = HostBootstrap::Rendezvous(path, 1, 2, absl::Seconds(10)); });
  const int first = AcceptWithin(listener.get(), absl::Seconds(20));
  if (first >= 0) {
    WriteAll(first, kConnectAgain);
    close(first);
  }
  const ScopedFd second_fd(first < 0 ? -1 : AcceptWithin(listener.get(), absl::Seconds(20)));
  const int second = second_fd.get();
  std::optional<std::string> introduction;
  if (second >= 0) introduction = ReceiveWithin(second, 12, absl::Seconds(20));
  if (!introduction.has_value()) {
    joiner.join();  // returns by the rank's deadline
    FAIL() << (first < 0    ? "the rank never connected"
               : second < 0 ? "the rank did not connect again after it was pushed out"
                            : "the rank did not introduce itself on its second connection")
           << "; it returned " << rank1.status();
  }
  int32_t hello[3] = {};
  std::memcpy(hello, introduction->data(), sizeof(hello));
  EXPECT_EQ(hello[0], kHelloMagic);
  EXPECT_EQ(hello[1], 1);
  EXPECT_EQ(hello[2], 2);
  WriteAll(second, std::string(4, '\0'));  // accepted
  joiner.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // The second connection is the rank's link to rank 0: a broadcast from it arrives.
  WriteAll(second, Frame(kKindBroadcast, 1, "after a push-out"));
  absl::StatusOr<std::string> got = (*rank1)->Broadcast("");
  EXPECT_EQ(got.value_or(""), "after a push-out") << got.status();
}

// A forked child process that runs a body and sends back what it returns through a pipe.
// Killed and reaped on destruction if still running.
class Child {
 public:
  // Forks; the child runs `body`, writes what it returns to the pipe and exits at once (_exit:
  // no atexit handlers, no test-framework teardown in the child). Call it while this process
  // runs no other thread: the child gets only the calling one.
  explicit Child(const std::function<std::string()>& body) {
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) {
      ended_ = absl::StrCat("pipe2 failed: ", std::strerror(errno));
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(ends[0]);
      const std::string out = body();
      for (size_t done = 0; done < out.size();) {
        const ssize_t n = write(ends[1], out.data() + done, out.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      _exit(0);
    }
    if (pid_ < 0) ended_ = absl::StrCat("fork failed: ", std::strerror(errno));
    close(ends[1]);
    result_ = ends[0];
    if (pid_ < 0) Close();
  }
  ~Child() { Close(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Returns how the child ended once Finish returned ("exited with status 0", "killed by signal
  // 9"), why it never started, or that it is still running.
  const std::string& ended() const { return ended_; }

  // Returns whether the child is done (it wrote its result and exited) without waiting.
  bool Done() const {
    pollfd p{result_, POLLIN, 0};
    return result_ >= 0 && poll(&p, 1, 0) == 1;
  }

  // Returns what the child wrote before it exited, or nullopt when it did not exit within
  // `wait` (it is killed then). Either way ended() then says how it ended.
  std::optional<std::string> Finish(absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    std::string got;
    while (result_ >= 0) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      pollfd p{result_, POLLIN, 0};
      if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) != 1) break;
      char bytes[256];
      const ssize_t n = read(result_, bytes, sizeof(bytes));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Close();  // end of file: the child exited
        return got;
      }
      got.append(bytes, static_cast<size_t>(n));
    }
    Close();
    return std::nullopt;
  }

 private:
  void Close() {
    if (result_ >= 0) close(result_);
    result_ = -1;
    if (pid_ > 0) {
      kill(pid_, SIGKILL);  // no effect on a child that exited; reaped below either way
      int wstatus = 0;
      if (waitpid(pid_, &wstatus, 0) != pid_) {
        ended_ = absl::StrCat("waitpid failed: ", std::strerror(errno));
      } else if (WIFEXITED(wstatus)) {
        ended_ = absl::StrCat("exited with status ", WEXITSTATUS(wstatus));
      } else if (WIFSIGNALED(wstatus)) {
        ended_ = absl::StrCat("killed by signal ", WTERMSIG(wstatus));
      }
    }
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int result_ = -1;
  std::string ended_ = "still running";
};

// A status as one line of text, and back: how a child process reports one.
std::string EncodeStatus(const absl::Status& status) {
  return absl::StrCat(static_cast<int>(status.code()), " ", status.message());
}

absl::Status DecodeStatus(const std::string& line) {
  const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 1));
  int code = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &code)) {
    return absl::InternalError(absl::StrCat("Not a status from the child process: ", line));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), parts[1]);
}

// Makes every later send() of this process (in a forked child) fail with EPIPE, as one does
// once the peer closed the connection. Returns false where seccomp filters are unavailable.
bool FailEverySend() {
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#else
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif
  // send() is the sendto system call on both.
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sendto, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPIPE & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
#else
  return false;  // the filter is written for x86-64 and aarch64 only
#endif
}

TEST(HostBootstrapTest, ARankWhoseIntroductionCannotGoOutReadsWhyRankZeroClosed) {
  // Rank 0 may close a rank's connection before the rank's introduction goes out: it pushed the
  // connection out as silent (and queued the notice to connect again first), or it ended the
  // rendezvous (refused another rank or gave up) and closed it without a word. The rank's send
  // then fails, and what rank 0 queued is still readable: the rank connects again only on the
  // notice, and otherwise fails at once, not at its deadline. The send fails only when rank 0
  // closes in the moment between the rank's connect and its send; to make that certain, the
  // rank runs in a forked child whose every send fails as it then does (EPIPE), and the test
  // plays rank 0: it pushes out the first connection and closes the second without a word.
  Child probe([] { return std::string(FailEverySend() ? "filtered" : "unfiltered"); });
  if (!probe.started()) GTEST_SKIP() << "the seccomp probe did not start: " << probe.ended();
  const std::optional<std::string> probed = probe.Finish(absl::Seconds(20));
  if (!probed.has_value()) {
    GTEST_SKIP() << "the seccomp probe did not finish within 20s (" << probe.ended() << ")";
  }
  if (*probed != "filtered") {
    GTEST_SKIP() << "no seccomp filters here to make the rank's sends fail (the probe said \""
                 << *probed << "\", " << probe.ended() << ")";
  }
  const std::string path = TempPath("closed_early");
  const ScopedFd listener(ListenAt(path));
  ASSERT_GE(listener.get(), 0);
  constexpr absl::Duration kTimeout = absl::Seconds(10);
  Child rank1([&] {
    close(listener.get());  // the child's copy
    if (!FailEverySend()) return EncodeStatus(absl::InternalError("No seccomp filter"));
    return EncodeStatus(HostBootstrap::Rendezvous(path, 1, 2, kTimeout).status());
  });
  ASSERT_TRUE(rank1.started()) << rank1.ended();
  const int first = AcceptWithin(listener.get(), absl::Seconds(20));
  if (first >= 0) {
    WriteAll(first, kConnectAgain);
    close(first);
  }
  const int second = first < 0 ? -1 : AcceptWithin(listener.get(), absl::Seconds(20));
  const absl::Time closed = absl::Now();
  if (second >= 0) close(second);
  const std::optional<std::string> result = rank1.Finish(kTimeout + absl::Seconds(20));
  const absl::Duration took = absl::Now() - closed;
  ASSERT_TRUE(result.has_value()) << "the rank did not return (" << rank1.ended() << ")";
  ASSERT_GE(first, 0) << "the rank never connected; it returned " << *result;
  ASSERT_GE(second, 0) << "the rank did not connect again after the notice; it returned "
                       << *result;
  const absl::Status status = DecodeStatus(*result);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
      << status << " (" << rank1.ended() << ")";
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("Rank 1 of 2: rank 0 at " + path +
                        " ended the rendezvous before every rank joined"));
  EXPECT_LT(took, kTimeout / 2) << "the rank waited for its deadline";
}

// Lowers this process's descriptor limit so that exactly `free` descriptors are free below it.
// Returns false when the limit cannot be set.
bool LeaveFreeDescriptors(int free) {
  int limit = 0;
  for (int found = 0; found < free; ++limit) {
    if (fcntl(limit, F_GETFD) < 0 && errno == EBADF) ++found;
  }
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  r.rlim_cur = static_cast<rlim_t>(limit);
  return setrlimit(RLIMIT_NOFILE, &r) == 0;
}

TEST(HostBootstrapSweepTest, RanksMeetAmidAFloodWhileRankZeroRunsOutOfDescriptors) {
  // Rank 0 runs in a forked child whose descriptor limit leaves room for its listener, the other
  // ranks and two more connections, far below world size + 64, while threads flood its socket
  // with silent connections. accept() fails with EMFILE over and over: rank 0 pushes out silent
  // connections to make room (or waits a moment for one to become silent), and the ranks meet.
  constexpr int kWorld = 4;
  constexpr absl::Duration kTimeout = absl::Seconds(60);
  const std::string path = TempPath("out_of_descriptors");
  const absl::Time start = absl::Now();
  Child rank0([&] {
    if (!LeaveFreeDescriptors(kWorld + 2)) return EncodeStatus(absl::InternalError("setrlimit"));
    absl::StatusOr<std::unique_ptr<HostBootstrap>> boot =
        HostBootstrap::Rendezvous(path, 0, kWorld, kTimeout);
    if (!boot.ok()) return EncodeStatus(boot.status());
    return EncodeStatus((*boot)->AllGather("rank0").status());
  });
  if (!rank0.started()) GTEST_SKIP() << "rank 0's process did not start: " << rank0.ended();
  SilentFlood flood(path, /*keep_open=*/50);
  // Far more connections than rank 0 has room for, unless it stopped listening.
  while (flood.connected() < 20 * (kWorld + 2) && !rank0.Done() &&
         absl::Now() - start < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::vector<absl::StatusOr<std::unique_ptr<HostBootstrap>>> boots(kWorld);
  std::vector<std::vector<std::string>> got(kWorld);
  std::vector<std::thread> ranks;
  if (!rank0.Done()) {
    for (int r = 1; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        boots[r] = HostBootstrap::Rendezvous(path, r, kWorld, kTimeout);
        if (!boots[r].ok()) return;
        absl::StatusOr<std::vector<std::string>> all =
            (*boots[r])->AllGather(absl::StrCat("rank", r));
        if (all.ok()) got[r] = *all;
      });
    }
  }
  const std::optional<std::string> result = rank0.Finish(kTimeout + absl::Seconds(10));
  for (auto& t : ranks) t.join();
  const absl::Duration took = absl::Now() - start;
  flood.Stop();
  ASSERT_TRUE(result.has_value()) << "rank 0 did not return (" << rank0.ended() << ")";
  const absl::Status status = DecodeStatus(*result);
  ASSERT_TRUE(status.ok()) << "rank 0: " << status << " (" << rank0.ended() << ")";
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld - 1));
  for (int r = 1; r < kWorld; ++r) {
    ASSERT_TRUE(boots[r].ok()) << "rank " << r << " " << boots[r].status();
    EXPECT_THAT(got[r], ElementsAre("rank0", "rank1", "rank2", "rank3")) << "rank " << r;
  }
  EXPECT_GE(flood.connected(), 20 * (kWorld + 2));
  EXPECT_LT(took, kTimeout / 2);
}

TEST(HostBootstrapTest, RankZeroOutOfDescriptorsWaitsWithoutSpinningAndSaysWhy) {
  // Rank 0 (a forked child) has room for its listener and one connection only. One of the two
  // other ranks joins; the other's connection stays in the listener's backlog and accept()
  // fails with EMFILE until the deadline. Rank 0 does not fail at once, nor spin on the listener
  // (readable all along): it waits out its timeout using little CPU and says what to raise.
  constexpr int kWorld = 3;
  constexpr absl::Duration kTimeout = absl::Seconds(2);
  const std::string path = TempPath("no_descriptors");
  Child rank0([&] {
    if (!LeaveFreeDescriptors(2)) {
      return absl::StrCat("0 ", EncodeStatus(absl::InternalError("setrlimit")));
    }
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    const absl::Status status = HostBootstrap::Rendezvous(path, 0, kWorld, kTimeout).status();
    getrusage(RUSAGE_SELF, &after);
    const absl::Duration cpu =
        absl::DurationFromTimeval(after.ru_utime) - absl::DurationFromTimeval(before.ru_utime) +
        absl::DurationFromTimeval(after.ru_stime) - absl::DurationFromTimeval(before.ru_stime);
    return absl::StrCat(absl::ToInt64Milliseconds(cpu), " ", EncodeStatus(status));
  });
  if (!rank0.started()) GTEST_SKIP() << "rank 0's process did not start: " << rank0.ended();
  std::vector<absl::Status> others(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 1; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      others[r] = HostBootstrap::Rendezvous(path, r, kWorld, absl::Seconds(20)).status();
    });
  }
  const std::optional<std::string> result = rank0.Finish(absl::Seconds(30));
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(result.has_value()) << "rank 0 did not return (" << rank0.ended() << ")";
  const std::vector<std::string> parts = absl::StrSplit(*result, absl::MaxSplits(' ', 1));
  int64_t cpu_ms = 0;
  ASSERT_EQ(parts.size(), 2u) << *result << " (" << rank0.ended() << ")";
  ASSERT_TRUE(absl::SimpleAtoi(parts[0], &cpu_ms)) << *result << " (" << rank0.ended() << ")";
  const absl::Status status = DecodeStatus(parts[1]);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("Only 2 of 3 ranks joined"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("Rank 0 ran out of file descriptors while accepting connections: raise "
                        "its limit (ulimit -n) to leave about 11 free for the rendezvous"));
  EXPECT_LT(cpu_ms, 500) << "rank 0 spun while it could not accept";
  // The ranks learn at once that rank 0 ended the rendezvous.
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(others[r].code(), absl::StatusCode::kUnavailable)
        << "rank " << r << " " << others[r];
  }
}

// Returns how many descriptors process `pid` may still open below its soft limit, or -1 when
// /proc cannot tell.
int FreeDescriptors(pid_t pid) {
  std::ifstream limits(absl::StrCat("/proc/", pid, "/limits"));
  int limit = -1;
  for (std::string line; limit < 0 && std::getline(limits, line);) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (absl::StartsWith(line, "Max open files") && words.size() > 3 &&
        !absl::SimpleAtoi(words[3], &limit)) {
      return -1;
    }
  }
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (limit < 0 || dir == nullptr) {
    if (dir != nullptr) closedir(dir);
    return -1;
  }
  int free = limit;
  while (const dirent* entry = readdir(dir)) {
    int fd = 0;
    if (absl::SimpleAtoi(entry->d_name, &fd) && fd < limit) --free;
  }
  closedir(dir);
  return free;
}

TEST(HostBootstrapTest, RankZeroThatAcceptsAgainAfterRunningOutDoesNotBlameDescriptors) {
  // Rank 0 (a forked child) has room for its listener and three connections. Silent
  // connections take them; rank 1's connection then finds none (EMFILE), and rank 0 pushes a
  // silent one out to accept rank 1. The others close and rank 0 drops them; one more
  // connection is then accepted with room to spare. Rank 2 never starts: rank 0 times out, and
  // since it accepted a connection after running out, the message does not ask for more
  // descriptors.
  constexpr int kWorld = 3;
  constexpr absl::Duration kTimeout = absl::Seconds(4);
  const std::string path = TempPath("descriptors_again");
  Child rank0([&] {
    if (!LeaveFreeDescriptors(4)) return EncodeStatus(absl::InternalError("setrlimit"));
    return EncodeStatus(HostBootstrap::Rendezvous(path, 0, kWorld, kTimeout).status());
  });
  if (!rank0.started()) GTEST_SKIP() << "rank 0's process did not start: " << rank0.ended();
  // Queued first, so accepted first: the listener's backlog is in order.
  const ScopedFd pushed(ConnectRaw(path));
  ASSERT_GE(pushed.get(), 0);
  std::optional<ScopedFd> closing[2];
  for (auto& c : closing) c.emplace(ConnectRaw(path));
  absl::Status rank1;
  std::thread joiner(
      [&] { rank1 = HostBootstrap::Rendezvous(path, 1, kWorld, absl::Seconds(20)).status(); });
  const std::optional<std::string> notice = BytesBeforeClose(pushed.get(), absl::Seconds(20));
  EXPECT_EQ(notice, kConnectAgain) << "rank 0 did not push a silent connection out";
  // Once the others close, rank 0 holds its listener and rank 1's connection: 2 of 4 free.
  for (auto& c : closing) c.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int free = FreeDescriptors(rank0.pid());
  while (free >= 0 && free < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    free = FreeDescriptors(rank0.pid());
  }
  EXPECT_EQ(free, 2) << "rank 0 did not drop the closed connections";
  const ScopedFd late(ConnectRaw(path));
  EXPECT_GE(late.get(), 0);
  const std::optional<std::string> result = rank0.Finish(absl::Seconds(30));
  joiner.join();
  ASSERT_TRUE(result.has_value()) << "rank 0 did not return (" << rank0.ended() << ")";
  const absl::Status status = DecodeStatus(*result);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded)
      << status << " (" << rank0.ended() << ")";
  EXPECT_THAT(std::string(status.message()), HasSubstr("Only 2 of 3 ranks joined"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("file descriptors")));
  EXPECT_EQ(rank1.code(), absl::StatusCode::kUnavailable) << rank1;
}

TEST(HostBootstrapTest, ASkippedCallOfTheSameKindEndsInErrorsWithinTheTimeout) {
  // Rank 1 skips the second of three unnamed all-gathers. Sequence numbers count calls, so its
  // next call is numbered like the skipped one and paired with it: no frame tells the skip, and
  // its bytes are read as that exchange's (host_bootstrap.h). The others' third call waits for
  // a call that never comes: rank 0 gives up at its timeout and shuts its connections, and rank
  // 2 fails too (at once, or at its own timeout); nothing hangs.
  constexpr int kWorld = 3;
  constexpr absl::Duration kTimeout = absl::Milliseconds(300);
  auto star = MakeStar(kWorld, kTimeout);
  std::vector<std::vector<std::vector<std::string>>> results(kWorld);
  std::vector<absl::Status> last(kWorld);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (int call = 1; call <= 3; ++call) {
        if (r == 1 && call == 2) continue;
        auto all = star[r]->AllGather(absl::StrCat("r", r, "c", call));
        last[r] = all.status();
        if (!all.ok()) return;
        results[r].push_back(*all);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(results[1].size(), 2u);
  EXPECT_THAT(results[1][1], ElementsAre("r0c2", "r1c3", "r2c2"));
  ASSERT_EQ(results[0].size(), 2u);
  EXPECT_THAT(results[0][1], ElementsAre("r0c2", "r1c3", "r2c2"));
  EXPECT_EQ(last[0].code(), absl::StatusCode::kDeadlineExceeded) << last[0];
  EXPECT_THAT(std::string(last[0].message()), HasSubstr("rank 1 did not answer"));
  EXPECT_THAT(last[2].code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << last[2];
}

// One call of `kind` (0 all-gather, 1 broadcast, 2 barrier, 3 agreement) named `call`: its status.
absl::Status CallOfKind(HostBootstrap& b, int kind, absl::string_view call) {
  switch (kind) {
    case 0:
      return b.AllGather(absl::StrCat("r", b.rank()), call).status();
    case 1:
      return b.Broadcast(absl::StrCat("r", b.rank()), call).status();
    case 2:
      return b.Barrier(call);
    default:
      return b.AllAgree(true, call).status();
  }
}

TEST(HostBootstrapTest, ASkippedNamedCallFailsEveryRankAtOnceNamingBothCalls) {
  // For each kind of exchange and each rank in turn: that rank skips the second of three calls
  // of that kind, named "step.a", "step.b" and "step.c". Its next call is numbered like the
  // skipped one, but its name tells the skip: every rank fails at that exchange, long before the
  // timeout, with Internal naming rank 0's call and the other rank's.
  constexpr int kWorld = 3;
  const char* const kCalls[] = {"step.a", "step.b", "step.c"};
  const char* const kKinds[] = {"all-gather", "broadcast", "barrier", "agreement"};
  for (int kind = 0; kind < 4; ++kind) {
    for (int skipper = 0; skipper < kWorld; ++skipper) {
      auto star = MakeStar(kWorld, absl::Seconds(30));
      std::vector<int> done(kWorld, 0);
      std::vector<absl::Status> last(kWorld);
      const absl::Time start = absl::Now();
      std::vector<std::thread> threads;
      for (int r = 0; r < kWorld; ++r) {
        threads.emplace_back([&, r] {
          for (int call = 0; call < 3; ++call) {
            if (r == skipper && call == 1) continue;
            last[r] = CallOfKind(*star[r], kind, kCalls[call]);
            if (!last[r].ok()) return;
            ++done[r];
          }
        });
      }
      for (auto& t : threads) t.join();
      EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << kKinds[kind] << ", skipper " << skipper;
      // Rank 0 compares the peers in rank order: a skipping rank 0 differs from rank 1 first.
      const int peer = skipper == 0 ? 1 : skipper;
      const std::string want = absl::StrCat(
          "at exchange 2 (", kKinds[kind], "), rank 0 made call '", kCalls[skipper == 0 ? 2 : 1],
          "' but rank ", peer, " made call '", kCalls[skipper == 0 ? 1 : 2], "'");
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(done[r], 1) << kKinds[kind] << ", skipper " << skipper << ", rank " << r;
        EXPECT_EQ(last[r].code(), absl::StatusCode::kInternal)
            << kKinds[kind] << ", skipper " << skipper << ", rank " << r << ": " << last[r];
        EXPECT_THAT(std::string(last[r].message()), HasSubstr(want)) << last[r];
        EXPECT_THAT(std::string(last[r].message()),
                    HasSubstr(absl::StrCat("Bootstrap rank ", r, ": ")))
            << last[r];
      }
    }
  }
}

TEST(HostBootstrapTest, CallNamesAreEscapedAndAnUnnamedCallMeetsNoNamedOne) {
  // Control characters (C0 and C1), a byte that is not UTF-8, a bidi override, a line separator
  // and a quote in a call name are escaped in the message, which stays one line of printable
  // ASCII; an unnamed call paired with a named one is a mismatch too.
  struct Case {
    std::string rank0_call, rank1_call, want;
  };
  const std::vector<Case> cases = {
      {"step\n\x1b[31m\xff", "x'y",
       "rank 0 made call 'step\\n\\x1b[31m\\xff' but rank 1 made call 'x\\'y'"},
      // A C1 control (U+009B, which terminals read as the start of an escape sequence) and a
      // bidi override (U+202E), in UTF-8.
      {"c1\xc2\x9b", "bidi\xe2\x80\xae",
       "rank 0 made call 'c1\\xc2\\x9b' but rank 1 made call 'bidi\\xe2\\x80\\xae'"},
      // A line separator (U+2028), which some viewers break the line at.
      {"line\xe2\x80\xa8sep", "",
       "rank 0 made call 'line\\xe2\\x80\\xa8sep' but rank 1 made an unnamed call"},
      {"", "named", "rank 0 made an unnamed call but rank 1 made call 'named'"},
      {std::string("nul\0", 4), "", "rank 0 made call 'nul\\x00' but rank 1 made an unnamed call"},
  };
  for (const Case& c : cases) {
    auto star = MakeStar(2, absl::Seconds(30));
    std::vector<absl::Status> got(2);
    std::thread rank1([&] { got[1] = star[1]->AllGather("b", c.rank1_call).status(); });
    got[0] = star[0]->AllGather("a", c.rank0_call).status();
    rank1.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(got[r].code(), absl::StatusCode::kInternal) << got[r];
      const std::string message(got[r].message());
      EXPECT_THAT(message, HasSubstr(c.want));
      // Printable ASCII only: no control character, and no byte of a multi-byte character.
      EXPECT_TRUE(std::all_of(message.begin(), message.end(),
                              [](char ch) { return ch >= 0x20 && ch < 0x7f; }))
          << message;
    }
  }
}

TEST(HostBootstrapTest, BroadcastsNamedOnSomeRanksOnly) {
  // An unnamed Broadcast on rank 0 sends at once; a peer whose Broadcast is named finds the
  // mismatch in the data and fails at once, and rank 0 learns at its next exchange (the peer's
  // announcement waits there, of another exchange). A named Broadcast on rank 0 waits for an
  // announcement that a peer with an unnamed one never sends: it ends at its timeout, and the
  // peer, shut out then, at once.
  {
    auto star = MakeStar(2, absl::Seconds(30));
    absl::Status peer;
    const absl::Time start = absl::Now();
    std::thread rank1([&] { peer = star[1]->Broadcast("", "named").status(); });
    EXPECT_TRUE(star[0]->Broadcast("data").ok());
    rank1.join();
    EXPECT_EQ(peer.code(), absl::StatusCode::kInternal) << peer;
    EXPECT_THAT(std::string(peer.message()),
                HasSubstr("rank 0 made an unnamed call but rank 1 made call 'named'"));
    const absl::Status next = star[0]->Barrier();
    EXPECT_EQ(next.code(), absl::StatusCode::kInternal) << next;
    EXPECT_THAT(std::string(next.message()), HasSubstr("out of step"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  {
    auto star = MakeStar(2, absl::Milliseconds(200));
    star[1]->set_timeout(absl::Seconds(30));
    absl::Status peer;
    const absl::Time start = absl::Now();
    std::thread rank1([&] { peer = star[1]->Broadcast("").status(); });
    const absl::Status root = star[0]->Broadcast("data", "named").status();
    rank1.join();
    EXPECT_EQ(root.code(), absl::StatusCode::kDeadlineExceeded) << root;
    EXPECT_THAT(std::string(root.message()), HasSubstr("rank 1 did not answer"));
    EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
}

TEST(HostBootstrapTest, AnOverlongCallNameIsRefusedAndThePeersLearnAtOnce) {
  auto star = MakeStar(2, absl::Seconds(30));
  const std::string longest(HostBootstrap::kMaxCallNameBytes, 'n');
  absl::Status root;
  std::thread rank0([&] {
    root = star[0]->Barrier(longest);
    if (root.ok()) root = star[0]->Barrier(longest);
  });
  const absl::Status fits = star[1]->Barrier(longest);
  const absl::Time start = absl::Now();
  const absl::Status over = star[1]->Barrier(longest + "n");
  rank0.join();
  EXPECT_TRUE(fits.ok()) << fits;
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << over;
  EXPECT_THAT(std::string(over.message()),
              HasSubstr(absl::StrCat("has ", longest.size() + 1, " bytes, over the limit of ",
                                     longest.size())));
  EXPECT_EQ(root.code(), absl::StatusCode::kUnavailable) << root;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Sticky, as every exchange error.
  EXPECT_EQ(star[1]->Barrier().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostBootstrapTest, AReportNamesRankZerosExchangeOnAPeerAtAnotherKind) {
  // Rank 1 makes an all-gather of another name; rank 2 is at a barrier of rank 0's name, the
  // same number. Rank 0 reads rank 1 first and reports the mismatch to both: rank 2's error
  // names rank 0's exchange (an all-gather), not its own barrier.
  auto star = MakeStar(3, absl::Seconds(30));
  std::vector<absl::Status> got(3);
  std::thread rank1([&] { got[1] = star[1]->AllGather("one", "b").status(); });
  std::thread rank2([&] { got[2] = star[2]->Barrier("a"); });
  got[0] = star[0]->AllGather("zero", "a").status();
  rank1.join();
  rank2.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kInternal) << "rank " << r << ": " << got[r];
    EXPECT_THAT(std::string(got[r].message()),
                HasSubstr("at exchange 1 (all-gather), rank 0 made call 'a' but rank 1 made "
                          "call 'b'"))
        << got[r];
  }
}

// Sends from `fd` until the connection takes no more (its peer reads nothing meanwhile).
// Returns the bytes sent, all 'f'.
size_t FillConnection(int fd) {
  const std::string chunk(4096, 'f');
  size_t filled = 0;
  while (true) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      return filled;
    }
  }
}

// A rank 0 of a world of 2 whose connection to the raw peer (the test plays rank 1) is full of
// earlier data that rank 1 has not read: sent through a second descriptor of rank 0's socket.
struct FullRankZero {
  std::unique_ptr<HostBootstrap> root;
  int raw = -1;
  size_t filled = 0;
  ~FullRankZero() {
    if (raw >= 0) close(raw);
  }
};

void MakeFullRankZero(FullRankZero* out) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  out->raw = sv[1];
  const ScopedFd filler(dup(sv[0]));
  ASSERT_GE(filler.get(), 0) << std::strerror(errno);
  auto root = HostBootstrap::FromConnectedSockets(0, 2, {sv[0]}, absl::Seconds(30));
  ASSERT_TRUE(root.ok()) << root.status();
  out->root = std::move(root).value();
  out->filled = FillConnection(filler.get());
  ASSERT_GT(out->filled, 0u);
}

// The report rank 0 sends when rank 1 made all-gather `theirs` where rank 0 made `ours`, both
// exchange 1.
std::string AllGatherReport(const std::string& ours, const std::string& theirs) {
  const int32_t odd = 1;
  const uint32_t kind = kKindAllGather;
  return Frame(kKindCallMismatch, 1,
               std::string(reinterpret_cast<const char*>(&odd), 4) +
                   std::string(reinterpret_cast<const char*>(&kind), 4) + theirs,
               ours);
}

TEST(HostBootstrapTest, ARankZeroReportWaitsForRoomInAFullConnection) {
  // Rank 1 has not read rank 0's earlier data (its connection is full) when rank 0 finds that
  // rank 1 made another call; rank 1 starts reading a while after rank 0 read its frame (longer
  // than the default wait, within the one set here). Rank 0 waits for the room: the report
  // follows the earlier data, then the connection closes, so rank 1 learns both calls rather
  // than only that it lost rank 0.
  FullRankZero full;
  ASSERT_NO_FATAL_FAILURE(MakeFullRankZero(&full));
  HostBootstrapTestPeer::SetReportWait(*full.root, absl::Seconds(20));
  WriteAll(full.raw, Frame(kKindAllGather, 1, "", "b"));
  std::optional<std::string> got;
  std::thread rank1([&] {
    // Rank 0 has read the frame once none of it is left in the connection.
    const absl::Time until = absl::Now() + absl::Seconds(20);
    int queued = 1;
    while (ioctl(full.raw, SIOCOUTQ, &queued) == 0 && queued > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Microseconds(100));
    }
    absl::SleepFor(absl::Milliseconds(300));  // rank 0 finds the connection full first
    got = BytesBeforeClose(full.raw, absl::Seconds(20));
  });
  const absl::Status status = full.root->AllGather("mine", "a").status();
  rank1.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 0 made call 'a' but rank 1 made "
                                                       "call 'b'"));
  ASSERT_TRUE(got.has_value()) << "rank 0 did not close the connection";
  ASSERT_GE(got->size(), full.filled);
  EXPECT_EQ(got->find_first_not_of('f'), full.filled) << "the earlier data is not whole";
  EXPECT_EQ(got->substr(full.filled), AllGatherReport("a", "b"));
}

TEST(HostBootstrapTest, APeerThatReadsNothingDoesNotHoldUpRankZerosError) {
  // As above, but with the default wait, and rank 1 reads nothing: rank 0 waits at most 100 ms
  // for room, then fails and shuts the connection. Rank 1 then finds its earlier data and the end,
  // without the report.
  FullRankZero full;
  ASSERT_NO_FATAL_FAILURE(MakeFullRankZero(&full));
  WriteAll(full.raw, Frame(kKindAllGather, 1, "", "b"));
  const absl::Time start = absl::Now();
  const absl::Status status = full.root->AllGather("mine", "a").status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 0 made call 'a' but rank 1 made "
                                                       "call 'b'"));
  const std::optional<std::string> got = BytesBeforeClose(full.raw, absl::Seconds(20));
  ASSERT_TRUE(got.has_value()) << "rank 0 did not close the connection";
  EXPECT_EQ(got->size(), full.filled);
  EXPECT_EQ(got->find_first_not_of('f'), std::string::npos) << "part of a report went out";
}

TEST(HostBootstrapTest, APeerBlockedInALargeSendReadsTheReport) {
  // Rank 2 is in the middle of sending a frame far larger than its connection holds when rank 0
  // finds that rank 1 (the test, raw) made another call. Rank 0 reports it and shuts the
  // connections: rank 2's send fails, and it reads the report instead of only losing rank 0.
  int sv1[2], sv2[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv1), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);
  const ScopedFd raw(sv1[1]);
  auto root = HostBootstrap::FromConnectedSockets(0, 3, {sv1[0], sv2[0]}, absl::Seconds(30));
  auto rank2 = HostBootstrap::FromConnectedSockets(2, 3, {sv2[1]}, absl::Seconds(30));
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(rank2.ok()) << rank2.status();
  std::vector<absl::Status> got(3);
  std::thread rank0_thread([&] { got[0] = (*root)->AllGather("zero", "a").status(); });
  std::thread rank2_thread(
      [&] { got[2] = (*rank2)->AllGather(std::string(8 << 20, 'x'), "a").status(); });
  // Rank 2's frame piles up unread in rank 0's end (rank 0 waits for rank 1 first).
  const absl::Time until = absl::Now() + absl::Seconds(20);
  int queued = 0;
  while (ioctl(sv2[0], SIOCINQ, &queued) == 0 && queued < (16 << 10) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE(queued, 16 << 10) << "rank 2 did not start sending";
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time start = absl::Now();
  WriteAll(raw.get(), Frame(kKindAllGather, 1, "one", "b"));
  rank0_thread.join();
  rank2_thread.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r : {0, 2}) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kInternal) << "rank " << r << ": " << got[r];
    EXPECT_THAT(std::string(got[r].message()),
                HasSubstr("at exchange 1 (all-gather), rank 0 made call 'a' but rank 1 made "
                          "call 'b'"))
        << got[r];
  }
  const std::optional<std::string> report = BytesBeforeClose(raw.get(), absl::Seconds(20));
  ASSERT_TRUE(report.has_value()) << "rank 0 did not close the connection";
  EXPECT_EQ(*report, AllGatherReport("a", "b"));
}

TEST(HostBootstrapTest, APeerThatAnnouncesANamedBroadcastAndDiesIsNamed) {
  // Rank 1 (the test, raw) announces its named Broadcast, then its process exits. Rank 0 has
  // every announcement, but cannot send rank 1 the data: Unavailable naming rank 1, at once;
  // rank 2, shut out then, fails at once too.
  int sv1[2], sv2[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv1), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);
  auto root = HostBootstrap::FromConnectedSockets(0, 3, {sv1[0], sv2[0]}, absl::Seconds(30));
  auto rank2 = HostBootstrap::FromConnectedSockets(2, 3, {sv2[1]}, absl::Seconds(30));
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(rank2.ok()) << rank2.status();
  WriteAll(sv1[1], Frame(kKindBroadcast, 1, "", "seed"));
  close(sv1[1]);
  absl::Status peer;
  const absl::Time start = absl::Now();
  std::thread rank2_thread([&] { peer = (*rank2)->Broadcast("", "seed").status(); });
  const absl::Status status = (*root)->Broadcast("data", "seed").status();
  rank2_thread.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("Bootstrap rank 0 could not send to rank 1 (connection closed)"));
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
  EXPECT_THAT(std::string(peer.message()), HasSubstr("lost rank 0"));
}

TEST(HostBootstrapTest, ARankThatCannotSendReadsOnlyAReportFromRankZero) {
  // Rank 0 (the test, raw) shut the connection before this rank could send, with a frame of its
  // own left unread. Only a call-mismatch report is read then (as in
  // CallMismatchReportsFromRankZeroAreReadOrRefused); rank 0's data (an all-gather reply, the
  // empty data of a named broadcast) is not taken for this rank's exchange, nor refused as one:
  // the error is the lost connection.
  for (const bool broadcast : {false, true}) {
    RawPeer peer = MakeRawPeer(1, 2, absl::Seconds(30));
    ASSERT_NE(peer.bootstrap, nullptr);
    WriteAll(peer.raw, broadcast ? Frame(kKindBroadcast, 1, "", "b")
                                 : Frame(kKindAllGather | kReplyBit, 1, Packed({"zero", "mine"})));
    shutdown(peer.raw, SHUT_RDWR);
    const absl::Status status = broadcast ? peer.bootstrap->Broadcast("", "b").status()
                                          : peer.bootstrap->AllGather("mine").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("Bootstrap rank 1 could not send to rank 0 (connection closed)"));
    EXPECT_EQ(peer.bootstrap->Barrier().code(), absl::StatusCode::kUnavailable);
  }
}

// Returns the reason in rank 0's verdict on `fd` ({uint32 length, that many bytes}), or nullopt
// when it does not all arrive within `wait`.
std::optional<std::string> ReceiveVerdict(int fd, absl::Duration wait) {
  const std::optional<std::string> length = ReceiveWithin(fd, 4, wait);
  if (!length.has_value()) return std::nullopt;
  uint32_t n = 0;
  std::memcpy(&n, length->data(), 4);
  return ReceiveWithin(fd, n, wait);
}

TEST(HostBootstrapTest, ARankOfAnotherProtocolVersionIsRefusedSayingSo) {
  // A process that introduces itself as rank 1 of 2, a rank of this rendezvous, but with another
  // version's magic would join and then misread every frame: rank 0 refuses it at once, naming
  // both versions, and tells it why.
  for (const OtherMagic& other : kOtherHelloMagics) {
    SCOPED_TRACE(other.text);
    const std::string path = TempPath(absl::StrCat("other_hello_", other.text));
    absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
    const absl::Time start = absl::Now();
    std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, 2, absl::Seconds(20)); });
    const ScopedFd fd(ConnectRaw(path));
    const int32_t hello[3] = {static_cast<int32_t>(other.magic), 1, 2};
    if (fd.get() >= 0) WriteAll(fd.get(), std::string(reinterpret_cast<const char*>(hello), 12));
    rank0.join();
    ASSERT_GE(fd.get(), 0);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition) << root.status();
    const std::string want = absl::StrCat(
        "as rank 1 of 2 speaking bootstrap protocol '", other.text,
        "', not this rank's 'kBo3': it is a kiln build with another bootstrap protocol; run the "
        "same build on every rank");
    EXPECT_THAT(std::string(root.status().message()), HasSubstr(want));
    const std::optional<std::string> reason = ReceiveVerdict(fd.get(), absl::Seconds(20));
    ASSERT_TRUE(reason.has_value());
    EXPECT_THAT(*reason, HasSubstr(want));
  }
}

TEST(HostBootstrapTest, AProcessOfAnotherVersionThatDoesNotFitIsDroppedAndTheRanksStillMeet) {
  // Processes of another version whose rank or world size is not this rendezvous's (another
  // job's, at the same path) come before the real rank: each is told why and dropped, and the
  // rendezvous goes on.
  const std::string path = TempPath("other_job");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
  std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, 2, absl::Seconds(20)); });
  struct Intro {
    int32_t rank, world;
  };
  const Intro intros[] = {{1, 4}, {2, 2}, {0, 2}, {-1, 2}, {5, 8}};
  std::vector<std::optional<std::string>> reasons;
  std::vector<bool> closed;
  for (const OtherMagic& other : kOtherHelloMagics) {
    for (const Intro& intro : intros) {
      const ScopedFd fd(ConnectRaw(path));
      if (fd.get() < 0) break;
      const int32_t hello[3] = {static_cast<int32_t>(other.magic), intro.rank, intro.world};
      WriteAll(fd.get(), std::string(reinterpret_cast<const char*>(hello), 12));
      reasons.push_back(ReceiveVerdict(fd.get(), absl::Seconds(20)));
      closed.push_back(ClosedByPeer(fd.get(), absl::Seconds(20)));
    }
  }
  absl::StatusOr<std::unique_ptr<HostBootstrap>> rank1 =
      HostBootstrap::Rendezvous(path, 1, 2, absl::Seconds(20));
  rank0.join();
  ASSERT_EQ(reasons.size(), std::size(kOtherHelloMagics) * std::size(intros));
  for (size_t i = 0; i < reasons.size(); ++i) {
    const OtherMagic& other = kOtherHelloMagics[i / std::size(intros)];
    const Intro& intro = intros[i % std::size(intros)];
    SCOPED_TRACE(absl::StrCat(other.text, " as rank ", intro.rank, " of ", intro.world));
    ASSERT_TRUE(reasons[i].has_value()) << "rank 0 did not say why it dropped the process";
    EXPECT_THAT(*reasons[i],
                HasSubstr(absl::StrCat("as rank ", intro.rank, " of ", intro.world,
                                       " speaking bootstrap protocol '", other.text,
                                       "', not this rank's 'kBo3', and does not fit world size 2 "
                                       "or names a rank that joined")));
    EXPECT_TRUE(closed[i]) << "rank 0 kept the connection";
  }
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  std::vector<std::string> got;
  std::thread peer([&] {
    auto all = (*rank1)->AllGather("one", "after_others");
    if (all.ok()) got = *all;
  });
  auto all = (*root)->AllGather("zero", "after_others");
  peer.join();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre("zero", "one"));
  EXPECT_THAT(got, ElementsAre("zero", "one"));
}

TEST(HostBootstrapTest, AProcessOfAnotherVersionNamingARankThatJoinedIsDropped) {
  // Rank 1 of this job has joined; a process of another version then introduces itself as rank 1
  // of the same world size. It cannot be this job's rank 1, so it is told why and dropped, and
  // rank 2 still completes the rendezvous.
  const std::string path = TempPath("other_job_taken_rank");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> root, rank1;
  std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, 3, absl::Seconds(20)); });
  std::thread first([&] { rank1 = HostBootstrap::Rendezvous(path, 1, 3, absl::Seconds(20)); });
  // Time for rank 0 to read rank 1's introduction before the other process's arrives.
  absl::SleepFor(absl::Milliseconds(500));
  std::optional<std::string> reason;
  bool closed = false;
  {
    const ScopedFd fd(ConnectRaw(path));
    ASSERT_GE(fd.get(), 0);
    const int32_t hello[3] = {static_cast<int32_t>(kOtherHelloMagics[0].magic), 1, 3};
    WriteAll(fd.get(), std::string(reinterpret_cast<const char*>(hello), 12));
    reason = ReceiveVerdict(fd.get(), absl::Seconds(20));
    closed = ClosedByPeer(fd.get(), absl::Seconds(20));
  }
  absl::StatusOr<std::unique_ptr<HostBootstrap>> rank2 =
      HostBootstrap::Rendezvous(path, 2, 3, absl::Seconds(20));
  rank0.join();
  first.join();
  ASSERT_TRUE(reason.has_value()) << "rank 0 did not say why it dropped the process";
  EXPECT_THAT(*reason, HasSubstr("as rank 1 of 3 speaking bootstrap protocol 'kBo1', not this "
                                 "rank's 'kBo3', and does not fit world size 3 or names a rank "
                                 "that joined"));
  EXPECT_TRUE(closed) << "rank 0 kept the connection";
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(rank2.ok()) << rank2.status();
}

TEST(HostBootstrapTest, ARankZeroThatGivesUpNamesTheProcessesOfAnotherVersionItDropped) {
  // No real rank comes, only processes of another version that do not fit: rank 0's
  // DeadlineExceeded counts them among the dropped connections and names the last one.
  const std::string path = TempPath("other_job_deadline");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
  std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, 2, absl::Seconds(2)); });
  for (const OtherMagic& other : kOtherHelloMagics) {
    const ScopedFd fd(ConnectRaw(path));
    if (fd.get() < 0) break;
    const int32_t hello[3] = {static_cast<int32_t>(other.magic), 3, 4};
    WriteAll(fd.get(), std::string(reinterpret_cast<const char*>(hello), 12));
    EXPECT_TRUE(ClosedByPeer(fd.get(), absl::Seconds(20))) << other.text;
  }
  rank0.join();
  EXPECT_EQ(root.status().code(), absl::StatusCode::kDeadlineExceeded) << root.status();
  EXPECT_THAT(std::string(root.status().message()),
              HasSubstr("Only 1 of 2 ranks joined the bootstrap at " + path +
                        " within 2s (2 connection(s) dropped: closed before introducing "
                        "themselves, pushed out by later ones while silent, or not kiln ranks; 2 "
                        "of them kiln processes of another bootstrap protocol whose rank or "
                        "world size does not fit, the last as rank 3 of 4 speaking 'kBo2': is "
                        "another job at this path?)"));
}

TEST(HostBootstrapTest, ARankThatAnOlderRankZeroDropsSaysWhy) {
  // The test plays a rank 0 whose build does not check versions: it drops an introduction whose
  // magic is not its own, reading it and closing without a word. The rank fails at once, and its
  // error names that cause too.
  const std::string path = TempPath("old_rank0");
  const ScopedFd listener(ListenAt(path));
  ASSERT_GE(listener.get(), 0);
  absl::Status status;
  std::thread rank1(
      [&] { status = HostBootstrap::Rendezvous(path, 1, 2, absl::Seconds(20)).status(); });
  const ScopedFd fd(AcceptWithin(listener.get(), absl::Seconds(20)));
  std::optional<std::string> hello;
  if (fd.get() >= 0) hello = ReceiveWithin(fd.get(), 12, absl::Seconds(20));
  const absl::Time closed = absl::Now();
  if (fd.get() >= 0) shutdown(fd.get(), SHUT_RDWR);
  rank1.join();
  EXPECT_LT(absl::Now() - closed, absl::Seconds(10));
  ASSERT_GE(fd.get(), 0) << "the rank never connected: " << status;
  ASSERT_TRUE(hello.has_value());
  int32_t magic = 0;
  std::memcpy(&magic, hello->data(), 4);
  EXPECT_EQ(magic, kHelloMagic);
  // Little-endian: the version byte comes first.
  EXPECT_EQ(hello->substr(0, 4), "3oBk");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("dropped this rank's introduction (it is a kiln build with another "
                        "bootstrap protocol)"));
}

TEST(HostBootstrapTest, ARefusalFromRankZeroIsEscaped) {
  // Whatever listens at the path (the test) answers the rank's introduction with a refusal of
  // raw bytes: control characters, a quote, bytes that are not UTF-8. The rank's error quotes
  // them escaped, never raw.
  const std::string path = TempPath("raw_refusal");
  const ScopedFd listener(ListenAt(path));
  ASSERT_GE(listener.get(), 0);
  absl::Status status;
  std::thread rank1(
      [&] { status = HostBootstrap::Rendezvous(path, 1, 2, absl::Seconds(20)).status(); });
  const ScopedFd fd(AcceptWithin(listener.get(), absl::Seconds(20)));
  if (fd.get() >= 0 && ReceiveWithin(fd.get(), 12, absl::Seconds(20)).has_value()) {
    const char raw[] = "no\x1b[2J\r\n'\xff\x00!";
    const std::string refusal(raw, sizeof(raw) - 1);
    const uint32_t length = refusal.size();
    WriteAll(fd.get(), std::string(reinterpret_cast<const char*>(&length), 4) + refusal);
  }
  rank1.join();
  ASSERT_GE(fd.get(), 0) << "the rank never connected: " << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // Quotes stay as sent (a refusal quotes its own values); control and non-ASCII bytes do not.
  EXPECT_EQ(status.message(), "Rank 0 refused: no\\x1b[2J\\r\\n'\\xff\\x00!");
  for (const char c : status.message()) {
    EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << static_cast<int>(c);
  }
}

TEST(HostBootstrapTest, AFrameOfAnotherProtocolVersionFailsAtOnce) {
  // A peer of another protocol version sends its frame: a barrier's frame with a 24-byte header
  // ("kBf1", shorter than this version's), or a whole 32-byte one ("kBf2", whose report payload
  // differs from this version's). The magic is read first, so each side fails at once, naming
  // both versions, instead of waiting for bytes that never come or misreading them.
  for (const OtherMagic& other : kOtherFrameMagics) {
    for (const int rank : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(other.text, " to rank ", rank));
      RawPeer peer = MakeRawPeer(rank, 2, absl::Seconds(30));
      ASSERT_NE(peer.bootstrap, nullptr);
      std::string frame(other.magic == 0x6b426631 ? 24 : kHeaderBytes, '\0');
      const uint32_t kind = kKindBarrier | (rank == 0 ? 0 : kReplyBit);
      const uint64_t sequence = 1;
      std::memcpy(&frame[0], &other.magic, 4);
      std::memcpy(&frame[4], &kind, 4);
      std::memcpy(&frame[8], &sequence, 8);
      WriteAll(peer.raw, frame);
      const absl::Time start = absl::Now();
      const absl::Status status = peer.bootstrap->Barrier();
      EXPECT_LT(absl::Now() - start, absl::Seconds(5));
      EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
      EXPECT_THAT(
          std::string(status.message()),
          HasSubstr(absl::StrCat("Bootstrap rank ", rank, " got a frame of bootstrap protocol '",
                                 other.text, "' from rank ", 1 - rank,
                                 ", not this rank's 'kBf3': that rank is a kiln build "
                                 "with another bootstrap protocol")));
    }
  }
}

TEST(HostBootstrapSweepTest, CallMismatchReportsFromRankZeroAreReadOrRefused) {
  // A raw peer plays rank 0 for rank 1 of a world of 3 and answers its named all-gather with a
  // report that rank 2 made another call: well-formed (Internal naming both calls, escaped, and
  // rank 0's exchange, which need not be this rank's), or naming a rank out of range or an
  // exchange kind that is not one, too short to hold a rank and a kind, over the size limit, or
  // for another exchange. Each is Internal, sticky; the rank reads the report also when rank 0
  // shut the connection before this rank could send (the report, not the closed connection,
  // says why).
  auto head = [](int32_t rank, uint32_t kind) {
    return std::string(reinterpret_cast<const char*>(&rank), sizeof(rank)) +
           std::string(reinterpret_cast<const char*>(&kind), sizeof(kind));
  };
  struct Case {
    std::string payload;
    uint64_t sequence;
    std::string want;
  };
  const std::vector<Case> cases = {
      {head(2, kKindAllGather) + "two\t", 1,
       "at exchange 1 (all-gather), rank 0 made call 'zero' but rank 2 made call 'two\\t'; the "
       "ranks are out of step"},
      {head(2, kKindBarrier) + "two", 1,
       "at exchange 1 (barrier), rank 0 made call 'zero' but rank 2 made call 'two'"},
      {head(1, kKindAgree), 1,
       "at exchange 1 (agreement), rank 0 made call 'zero' but rank 1 made an unnamed call"},
      {head(0, kKindAllGather) + "x", 1,
       "malformed call-mismatch report from rank 0 (9 bytes, rank 0 of 3, exchange kind 1)"},
      {head(3, kKindAllGather) + "x", 1, "malformed call-mismatch report"},
      {head(-1, kKindAllGather), 1, "malformed call-mismatch report"},
      {head(2, 0) + "two", 1, "(11 bytes, rank 2 of 3, exchange kind 0)"},
      {head(2, kKindCallMismatch) + "two", 1, "(11 bytes, rank 2 of 3, exchange kind 5)"},
      {head(2, kKindAllGather | kReplyBit) + "two", 1,
       "(11 bytes, rank 2 of 3, exchange kind 257)"},
      {head(2, kKindAllGather).substr(0, 7), 1,
       "malformed call-mismatch report from rank 0 (7 bytes, rank -1 of 3, exchange kind 0)"},
      {"ab", 1, "malformed call-mismatch report from rank 0 (2 bytes, rank -1 of 3"},
      {head(2, kKindAllGather) + std::string(HostBootstrap::kMaxCallNameBytes + 1, 'n'), 1,
       "call-mismatch report frame, over the limit"},
      {head(2, kKindAllGather) + "two", 2, "sent exchange 2 (call-mismatch report)"},
  };
  for (const Case& c : cases) {
    for (const bool shut_first : {false, true}) {
      RawPeer peer = MakeRawPeer(1, 3, absl::Seconds(30));
      ASSERT_NE(peer.bootstrap, nullptr);
      WriteAll(peer.raw, Frame(kKindCallMismatch, c.sequence, c.payload, "zero"));
      if (shut_first) shutdown(peer.raw, SHUT_RDWR);  // this rank's send fails
      const absl::Time start = absl::Now();
      const absl::Status got = peer.bootstrap->AllGather("mine", "one").status();
      EXPECT_LT(absl::Now() - start, absl::Seconds(5));
      EXPECT_EQ(got.code(), absl::StatusCode::kInternal) << got;
      EXPECT_THAT(std::string(got.message()), HasSubstr(c.want)) << "shut first " << shut_first;
      EXPECT_EQ(peer.bootstrap->Barrier("next").code(), absl::StatusCode::kInternal);
    }
  }
}

TEST(HostBootstrapSweepTest, BadIntroductionsAreRefusedNamingTheirValues) {
  // A process that introduces itself as kiln with a rank or world size that does not fit (random
  // and extreme values) is refused: rank 0 fails with InvalidArgument naming both values, and the
  // process reads the same reason. A process that connects and stays silent makes rank 0 give up
  // at its deadline, saying what it waited for.
  std::mt19937 rng(8);
  const int32_t edges[] = {INT32_MIN, -1, 0, 3, 4, 1000, INT32_MAX};
  for (int round = 0; round < 12; ++round) {
    const int world = 3;
    int32_t rank = rng() % 2 == 0 ? edges[rng() % 7] : static_cast<int32_t>(rng());
    int32_t claimed_world = rng() % 2 == 0 ? world : edges[rng() % 7];
    if (claimed_world == world && rank >= 1 && rank < world) rank = world;  // make it not fit
    const std::string path = TempPath(absl::StrCat("intro", round));
    absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
    std::thread rank0([&] { root = HostBootstrap::Rendezvous(path, 0, world, absl::Seconds(10)); });
    const int fd = ConnectRaw(path);
    ASSERT_GE(fd, 0);
    const int32_t hello[3] = {kHelloMagic, rank, claimed_world};
    WriteAll(fd, std::string(reinterpret_cast<const char*>(hello), 12));
    rank0.join();
    EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument) << root.status();
    const std::string want = absl::StrCat("as rank ", rank, " of ", claimed_world);
    EXPECT_THAT(std::string(root.status().message()), HasSubstr(want));
    uint32_t length = 0;
    ASSERT_EQ(recv(fd, &length, 4, MSG_WAITALL), 4);
    std::string reason(std::min<uint32_t>(length, 4096), '\0');
    ASSERT_EQ(recv(fd, reason.data(), reason.size(), MSG_WAITALL),
              static_cast<ssize_t>(reason.size()));
    EXPECT_THAT(reason, HasSubstr(want));
    close(fd);
  }
  const std::string path = TempPath("silent");
  absl::StatusOr<std::unique_ptr<HostBootstrap>> root;
  std::thread rank0(
      [&] { root = HostBootstrap::Rendezvous(path, 0, 2, absl::Milliseconds(500)); });
  const int fd = ConnectRaw(path);
  ASSERT_GE(fd, 0);
  rank0.join();
  close(fd);
  EXPECT_EQ(root.status().code(), absl::StatusCode::kDeadlineExceeded) << root.status();
  EXPECT_THAT(std::string(root.status().message()), HasSubstr("to introduce itself"));

  // Two silent connections: rank 0 waited for both at once and says so.
  const std::string two_path = TempPath("two_silent");
  std::thread two_rank0(
      [&] { root = HostBootstrap::Rendezvous(two_path, 0, 3, absl::Milliseconds(500)); });
  const int first = ConnectRaw(two_path);
  const int second = ConnectRaw(two_path);
  two_rank0.join();
  EXPECT_GE(first, 0);
  EXPECT_GE(second, 0);
  close(first);
  close(second);
  EXPECT_EQ(root.status().code(), absl::StatusCode::kDeadlineExceeded) << root.status();
  EXPECT_THAT(std::string(root.status().message()),
              HasSubstr("Only 1 of 3 ranks joined the bootstrap at " + two_path +
                        " within 500ms, waiting for 2 connected processes to introduce themselves"));
}

}  // namespace
}  // namespace kiln
