#include "collectives/host_bootstrap.h"

#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace kiln
