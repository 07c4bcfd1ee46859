#include "collectives/host_bootstrap.h"

#include <sys/socket.h>
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
