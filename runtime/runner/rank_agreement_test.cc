#include "runtime/runner/rank_agreement.h"

#include <sys/socket.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

// A connected star of `world` bootstraps in this process (each used by its own thread).
std::vector<std::unique_ptr<HostBootstrap>> MakeStar(int world) {
  std::vector<std::vector<int>> fds(world);
  for (int i = 1; i < world; ++i) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fds[0].push_back(sv[0]);
    fds[i].push_back(sv[1]);
  }
  std::vector<std::unique_ptr<HostBootstrap>> out;
  for (int r = 0; r < world; ++r) {
    auto b = HostBootstrap::FromConnectedSockets(r, world, fds[r], absl::Seconds(10));
    EXPECT_TRUE(b.ok()) << b.status();
    out.push_back(std::move(b).value());
  }
  return out;
}

// Runs AgreeOnStatus on every rank with `local[r]` and returns what each rank got.
std::vector<absl::Status> Agree(const std::vector<absl::Status>& local) {
  const int world = static_cast<int>(local.size());
  auto star = MakeStar(world);
  std::vector<absl::Status> got(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { got[r] = AgreeOnStatus(*star[r], local[r], "Capture of x"); });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

TEST(RankAgreementTest, EveryRankOkIsOk) {
  for (const absl::Status& s : Agree({absl::OkStatus(), absl::OkStatus(), absl::OkStatus()})) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(RankAgreementTest, OneFailingRankFailsEveryRankAlike) {
  const std::vector<absl::Status> got =
      Agree({absl::OkStatus(), absl::OkStatus(),
             absl::ResourceExhaustedError("Pool budget of 4096 bytes exceeded"), absl::OkStatus()});
  for (const absl::Status& s : got) {
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_EQ(s.message(),
              "Capture of x failed on rank 2 of 4: Pool budget of 4096 bytes exceeded");
  }
}

TEST(RankAgreementTest, TheRootCauseWinsOverAPeerTimeout) {
  const std::vector<absl::Status> got =
      Agree({absl::DeadlineExceededError("Peer 1 did not answer"),
             absl::InternalError("Kernel failed"), absl::InvalidArgumentError("Bad size")});
  for (const absl::Status& s : got) {
    EXPECT_TRUE(absl::IsInternal(s)) << s;
    EXPECT_EQ(s.message(), "Capture of x failed on rank 1 of 3: Kernel failed");
  }
}

TEST(RankAgreementTest, ADeadPeerEndsTheExchangeWithAnError) {
  auto star = MakeStar(2);
  star[1].reset();  // rank 1's sockets close: it died
  const absl::Status s = AgreeOnStatus(*star[0], absl::OkStatus(), "Capture of x");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
}

}  // namespace
}  // namespace kiln
