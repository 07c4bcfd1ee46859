#include "runtime/runner/rank_agreement.h"

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// Runs `fn(bootstrap, rank)` for every rank of a new star of `world` bootstraps, each rank on its
// own thread, and returns once every rank's call returned.
void OnEveryRank(int world, const std::function<void(HostBootstrap&, int)>& fn) {
  auto star = MakeStar(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { fn(*star[r], r); });
  }
  for (std::thread& t : threads) t.join();
}

// Runs AgreeOnStatus on every rank with `local[r]` and returns what each rank got.
std::vector<absl::Status> Agree(const std::vector<absl::Status>& local) {
  const int world = static_cast<int>(local.size());
  std::vector<absl::Status> got(world);
  OnEveryRank(world, [&](HostBootstrap& bootstrap, int r) {
    got[r] = AgreeOnStatus(bootstrap, local[r], "Capture of x", "rank_agreement_test.x");
  });
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
  const absl::Status s =
      AgreeOnStatus(*star[0], absl::OkStatus(), "Capture of x", "rank_agreement_test.x");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
}

// A peer at another call of the bootstrap, of the same kind (an all-gather) and number, is caught
// by the call's name: every rank fails with Internal naming both calls, the agreeing ones too.
TEST(RankAgreementTest, APeerAtAnotherCallFailsEveryRankNamingBothCalls) {
  for (const char* other : {"", "custom_allreduce.setup"}) {
    std::vector<absl::Status> got(3);
    OnEveryRank(3, [&](HostBootstrap& bootstrap, int r) {
      got[r] = r == 2 ? bootstrap.AllGather("bytes", other).status()
                      : AgreeOnStatus(bootstrap, absl::OkStatus(), "Capture of decode/8",
                                      "runner.capture_agreement.decode/8");
    });
    const std::string theirs =
        *other == '\0' ? "an unnamed call" : absl::StrCat("call '", other, "'");
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(absl::IsInternal(got[r])) << "rank " << r << ": " << got[r];
      EXPECT_NE(got[r].message().find(absl::StrCat(
                    "rank 0 made call 'runner.capture_agreement.decode/8' but rank 2 made ",
                    theirs)),
                absl::string_view::npos)
          << got[r];
    }
  }
}

// A peer at another kind of call (a barrier), even of the same name, is out of step: Internal on
// rank 0, which reads its frame, and Unavailable on the others, whose connections rank 0 shuts.
TEST(RankAgreementTest, APeerAtAnotherKindOfCallFailsRankZeroOutOfStepAndShutsTheOthersOut) {
  std::vector<absl::Status> got(3);
  OnEveryRank(3, [&](HostBootstrap& bootstrap, int r) {
    got[r] = r == 2 ? bootstrap.Barrier("runner.capture_agreement.decode/8")
                    : AgreeOnStatus(bootstrap, absl::OkStatus(), "Capture of decode/8",
                                    "runner.capture_agreement.decode/8");
  });
  EXPECT_TRUE(absl::IsInternal(got[0])) << got[0];
  EXPECT_NE(got[0].message().find("is at exchange 1 (all-gather) but rank 2 sent exchange 1 "
                                  "(barrier); the ranks are out of step"),
            absl::string_view::npos)
      << got[0];
  for (int r : {1, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(got[r])) << "rank " << r << ": " << got[r];
    EXPECT_NE(got[r].message().find("lost rank 0"), absl::string_view::npos) << got[r];
  }
}

// Agreements in a loop named by their item (as the runner names its per-size capture agreements
// by the key): a rank that skips one is caught at its next, on every rank, naming both calls,
// before any of them returns OK.
TEST(RankAgreementTest, AgreementsNamedByTheirItemCatchASkippedOne) {
  std::vector<absl::Status> got(3);
  std::vector<int> agreed(3, 0);
  OnEveryRank(3, [&](HostBootstrap& bootstrap, int r) {
    for (const int size : {8, 4}) {
      if (r == 1 && size == 8) continue;  // skips the first
      const std::string key = absl::StrCat("decode/", size);
      got[r] = AgreeOnStatus(bootstrap, absl::OkStatus(), absl::StrCat("Capture of ", key),
                             absl::StrCat("runner.capture_agreement.", key));
      if (!got[r].ok()) return;
      ++agreed[r];
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(agreed[r], 0) << "rank " << r;
    EXPECT_TRUE(absl::IsInternal(got[r])) << "rank " << r << ": " << got[r];
    EXPECT_NE(got[r].message().find("rank 0 made call 'runner.capture_agreement.decode/8' but "
                                    "rank 1 made call 'runner.capture_agreement.decode/4'"),
              absl::string_view::npos)
        << got[r];
  }
}

// One round of the sweep on one rank: a status to agree on, or raw bytes that rank brings to the
// same exchange instead (an all-gather under the agreement's call name: a corrupt record).
struct RankTurn {
  bool raw = false;
  absl::Status local;
  std::string bytes;
};

// The agreed status by the header's rule, from what each rank brought: a raw record is an
// Internal error of that rank, whose message starts with the text given here. Sets *exact when
// the whole message is known.
absl::Status Expected(const std::vector<RankTurn>& turns, const std::string& what, bool* exact) {
  const int world = static_cast<int>(turns.size());
  auto consequence = [](const absl::Status& s) {
    return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
  };
  int chosen = -1;
  absl::Status cause;
  for (int r = 0; r < world; ++r) {
    const absl::Status s =
        turns[r].raw ? absl::InternalError(absl::StrCat("Rank ", r, " sent ", turns[r].bytes.size(),
                                                        " bytes that are not a status record"))
                     : turns[r].local;
    if (s.ok()) continue;
    if (chosen < 0 || (consequence(cause) && !consequence(s))) {
      chosen = r;
      cause = s;
    }
  }
  *exact = chosen < 0 || !turns[chosen].raw;
  if (chosen < 0) return absl::OkStatus();
  return absl::Status(cause.code(), absl::StrCat(what, " failed on rank ", chosen, " of ", world,
                                                 ": ", cause.message()));
}

// Random rounds over stars of 1 to 5 ranks: OK, every canonical code, codes outside absl's
// range, empty, binary (NUL bytes) and 64 KiB messages, an empty or binary `what`, and ranks that
// send raw bytes under the round's call name instead of a record: empty, a few bytes, a
// record without its tag (the old format, whose 4 zero bytes used to read as OK), 64 random
// bytes. Every agreeing rank returns the same status, the one the rule picks; a raw record is an
// error naming its rank.
TEST(RankAgreementTest, AdversarialRoundsAgreeOnEveryRank) {
  std::mt19937 rng(31337);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  auto message = [&]() -> std::string {
    switch (pick(5)) {
      case 0:
        return "";
      case 1:
        return std::string("nul\0inside", 10);
      case 2:
        return std::string(64 * 1024, static_cast<char>('a' + pick(26)));
      default:
        return absl::StrCat("Kernel ", pick(1000), " failed");
    }
  };
  int rounds_run = 0, ok_rounds = 0, raw_rounds = 0;
  for (int world = 1; world <= 5; ++world) {
    constexpr int kRounds = 120;
    std::vector<std::vector<RankTurn>> turns(kRounds, std::vector<RankTurn>(world));
    std::vector<std::string> whats(kRounds);
    for (int round = 0; round < kRounds; ++round) {
      whats[round] = pick(6) == 0 ? std::string("\0\xff", 2) : absl::StrCat("Step ", round);
      const bool all_ok = pick(3) == 0;
      for (int r = 0; r < world; ++r) {
        RankTurn& t = turns[round][r];
        if (all_ok) continue;
        const int kind = pick(12);
        if (kind < 5) continue;  // OK
        if (kind < 9) {
          t.local = absl::Status(static_cast<absl::StatusCode>(1 + pick(16)), message());
        } else if (kind < 10) {
          // Outside absl's codes: absl reads them as kUnknown.
          t.local = absl::Status(static_cast<absl::StatusCode>(pick(2) == 0 ? 42 : -3), message());
        } else {
          t.raw = true;
          switch (pick(4)) {
            case 0:
              t.bytes = "";
              break;
            case 1:
              t.bytes = std::string(1 + pick(7), '\0');
              break;
            case 2:
              t.bytes = std::string(4, '\0') + "untagged message";
              break;
            default:
              for (int i = 0; i < 64; ++i) t.bytes.push_back(static_cast<char>(rng()));
          }
        }
      }
    }
    std::vector<std::vector<absl::Status>> got(kRounds, std::vector<absl::Status>(world));
    OnEveryRank(world, [&](HostBootstrap& bootstrap, int r) {
      for (int round = 0; round < kRounds; ++round) {
        const RankTurn& t = turns[round][r];
        const std::string call = absl::StrCat("rank_agreement_test.round.", round);
        if (t.raw) {
          got[round][r] = bootstrap.AllGather(t.bytes, call).status();
        } else {
          got[round][r] = AgreeOnStatus(bootstrap, t.local, whats[round], call);
        }
      }
    });
    for (int round = 0; round < kRounds; ++round) {
      bool exact = true;
      const absl::Status want = Expected(turns[round], whats[round], &exact);
      bool any_raw = false;
      for (int r = 0; r < world; ++r) {
        if (turns[round][r].raw) {
          any_raw = true;
          ASSERT_TRUE(got[round][r].ok()) << got[round][r];  // its AllGather itself went through
          continue;
        }
        ASSERT_EQ(got[round][r].code(), want.code())
            << "world " << world << " round " << round << " rank " << r << ": " << got[round][r];
        const absl::string_view message = got[round][r].message();
        ASSERT_EQ(exact ? message : message.substr(0, want.message().size()), want.message())
            << "world " << world << " round " << round << " rank " << r;
      }
      ++rounds_run;
      ok_rounds += want.ok();
      raw_rounds += any_raw;
    }
  }
  EXPECT_EQ(rounds_run, 5 * 120);
  EXPECT_GT(ok_rounds, 100);
  EXPECT_GT(raw_rounds, 50);
}

}  // namespace
}  // namespace kiln
