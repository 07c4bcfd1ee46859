#include "collectives/host_bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

absl::Status ErrnoStatus(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", std::strerror(errno)));
}

absl::Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return ErrnoStatus("fcntl");
  return absl::OkStatus();
}

// Waits until one of the `n` descriptors at `fds` is ready for its events (their revents say
// which) or `deadline` passes. Returns false on timeout.
absl::StatusOr<bool> WaitAnyReady(pollfd* fds, nfds_t n, absl::Time deadline) {
  while (true) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // poll takes an int: a wait of 2^31 ms (24.9 days) or more, an infinite timeout included,
    // would wrap to a negative value (wait forever, past the deadline) or to 0 (spin). Wait at
    // most a day at a time; the loop checks the deadline again.
    constexpr int64_t kMaxPollMs = 24 * 60 * 60 * 1000;
    const int ms = static_cast<int>(std::min(absl::ToInt64Milliseconds(left), kMaxPollMs - 1) + 1);
    int ready = poll(fds, n, ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll");
    }
    if (ready > 0) return true;
  }
}

// Waits until `fd` is ready for `events` or `deadline` passes. Returns false on timeout.
absl::StatusOr<bool> WaitReady(int fd, short events, absl::Time deadline) {
  pollfd p{fd, events, 0};
  return WaitAnyReady(&p, 1, deadline);
}

absl::StatusOr<bool> SendAll(int fd, const char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ASSIGN_OR_RETURN(bool ready, WaitReady(fd, POLLOUT, deadline));
      if (!ready) return false;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return absl::UnavailableError("connection closed");
    }
    return ErrnoStatus("send");
  }
  return true;
}

absl::StatusOr<bool> ReceiveAll(int fd, char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    ssize_t n = recv(fd, data, size, 0);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      ASSIGN_OR_RETURN(bool ready, WaitReady(fd, POLLIN, deadline));
      if (!ready) return false;
      continue;
    }
    if (errno == ECONNRESET) return absl::UnavailableError("connection closed");
    return ErrnoStatus("recv");
  }
  return true;
}

absl::Status CheckShape(int rank, int world_size) {
  if (world_size < 1 || world_size > HostBootstrap::kMaxWorldSize || rank < 0 ||
      rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d of world size %d is out of range; pass 0 <= rank < world_size <= %d", rank,
        world_size, HostBootstrap::kMaxWorldSize));
  }
  return absl::OkStatus();
}

absl::Status CheckTimeout(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    // A deadline already past would fail every exchange at once, blaming a healthy peer.
    return absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap timeout %s must be positive; pass how long a peer may take to answer (e.g. "
        "absl::Seconds(60))",
        absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

// A joining rank introduces itself with {kHelloMagic, rank, world size} (int32 each), and every
// exchange frame starts with kFrameMagic. The two magics name this build's bootstrap protocol:
// read as numbers, their high three bytes are "kBo" (hello) and "kBf" (frame) and their low byte
// is the protocol's version, '3'; sent little-endian, so on the wire the version byte comes first
// ("3oBk", "3fBk"). Both change together whenever the meaning of any byte on the wire changes (a
// header, a payload's layout), so that a process of another kiln build is told apart at the
// rendezvous by its hello, and between connected sockets by its first frame. This build drops a
// hello whose high three bytes differ (another program); of a hello of another version
// (MagicVersionDiffers) it ends the rendezvous only when its rank and world size fit this job and
// that rank has not joined, and otherwise tells it why and drops it (see Rendezvous); it refuses
// a frame of another version or magic.
constexpr int32_t kHelloMagic = 0x6b426f33;  // "kBo3"

// Every exchange frame starts with this header; `call_size` bytes of the call's name, then
// `size` bytes of payload follow.
struct FrameHeader {
  uint32_t magic;
  uint32_t kind;       // HostBootstrap::Exchange; kReplyBit set on rank 0's all-gather reply
  uint64_t sequence;   // the exchange's number, counted alike on every rank
  uint64_t size;       // of the payload
  uint64_t call_size;  // of the call's name; 0 for an unnamed call
};
static_assert(sizeof(FrameHeader) == 32, "the frame header is sent as raw bytes");
constexpr uint32_t kFrameMagic = 0x6b426633;  // "kBf3"
constexpr uint32_t kReplyBit = 0x100;

// Whether `magic` is `ours` of another version: the same high three bytes ("kBo", "kBf"), another
// low byte (the version). Such a peer is a kiln build with another bootstrap protocol.
bool MagicVersionDiffers(uint32_t magic, uint32_t ours) {
  return magic != ours && (magic >> 8) == (ours >> 8);
}

// A magic as its four characters, high byte first ("kBo3"), escaped where one is not printable.
std::string MagicText(uint32_t magic) {
  const char text[4] = {static_cast<char>(magic >> 24), static_cast<char>(magic >> 16),
                        static_cast<char>(magic >> 8), static_cast<char>(magic)};
  return absl::CHexEscape(absl::string_view(text, sizeof(text)));
}

// The first allocation for an incoming frame; it grows as bytes arrive (doubling), so a header
// that announces more than the peer sends costs no more memory than what came.
constexpr uint64_t kFirstChunkBytes = 64 * 1024;

// Rank 0's verdict on a joining rank, sent once every rank joined (or at once, to a rank it
// refuses): a uint32 length and that many bytes of the reason it refused, none when accepted.
absl::StatusOr<bool> SendVerdict(int fd, absl::string_view refusal, absl::Time deadline) {
  const uint32_t length = static_cast<uint32_t>(refusal.size());
  ASSIGN_OR_RETURN(bool sent, SendAll(fd, reinterpret_cast<const char*>(&length), sizeof(length),
                                      deadline));
  if (!sent || refusal.empty()) return sent;
  return SendAll(fd, refusal.data(), refusal.size(), deadline);
}

// Sent alone in place of a verdict's length: rank 0 pushed the connection out while it looked
// silent (the rendezvous was full). A rank whose introduction had not arrived connects again.
constexpr uint32_t kConnectAgain = 0xffffffff;

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  fds.clear();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostBootstrap>> HostBootstrap::FromConnectedSockets(
    int rank, int world_size, std::vector<int> fds, absl::Duration timeout) {
  absl::Status shape = CheckShape(rank, world_size);
  if (shape.ok()) shape = CheckTimeout(timeout);
  const size_t expected = rank == 0 ? static_cast<size_t>(std::max(world_size, 1) - 1) : 1;
  if (shape.ok() && fds.size() != expected) {
    shape = absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d of %d needs %d connected sockets, got %d", rank, world_size, expected,
        fds.size()));
  }
  for (int fd : fds) {
    if (!shape.ok()) break;
    if (fd < 0) {
      shape = absl::InvalidArgumentError(absl::StrFormat(
          "Rank %d of %d got socket descriptor %d; pass connected sockets", rank, world_size, fd));
      break;
    }
    shape = SetNonBlocking(fd);
  }
  if (!shape.ok()) {
    CloseAll(fds);
    return shape;
  }
  return std::unique_ptr<HostBootstrap>(
      new HostBootstrap(rank, world_size, std::move(fds), timeout));
}

absl::StatusOr<std::unique_ptr<HostBootstrap>> HostBootstrap::Rendezvous(
    const std::string& path, int rank, int world_size, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckShape(rank, world_size));
  RETURN_IF_ERROR(CheckTimeout(timeout));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap socket path '%s' must have 1 to %d characters; use a shorter directory or "
        "an abstract name ('@name')",
        absl::CHexEscape(path), sizeof(addr.sun_path) - 1));
  }
  // "@name" is Linux's abstract namespace: no file to create or remove.
  const bool abstract = path[0] == '@';
  if (!abstract && path.find('\0') != std::string::npos) {
    // The kernel would stop at the NUL and bind (and rank 0 unlink) a different file.
    return absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap socket path '%s' has a NUL byte at %d; pass a path without one",
        absl::CHexEscape(path), path.find('\0')));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (abstract) addr.sun_path[0] = '\0';
  const socklen_t addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (abstract ? 0 : 1));
  const absl::Time deadline = absl::Now() + timeout;
  if (world_size == 1) return FromConnectedSockets(0, 1, {}, timeout);

  if (rank == 0) {
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listener < 0) return ErrnoStatus("socket");
    if (!abstract) unlink(path.c_str());
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), addr_len) < 0 ||
        listen(listener, world_size) < 0) {
      absl::Status s = ErrnoStatus(absl::StrCat("bind/listen on ", path));
      close(listener);
      return s;
    }
    std::vector<int> fds(world_size - 1, -1);
    // Accepted connections that have not introduced themselves yet, each with its own buffer:
    // poll() watches them and the listener together, so a connection that stays silent holds up
    // no other. At most world_size + 64 wait at a time, which bounds the descriptors a flood of
    // connections can take. Beyond that, a new connection pushes out the one that has waited
    // longest among the silent ones: some poll() round since it was accepted reported nothing
    // from it (it had its chance to introduce itself), and nothing waits to be read from it now
    // (a rank introduces itself as soon as it connects, in one piece). A connection accepted
    // since the last poll() is never pushed out: its introduction may sit unread in its socket.
    // When no connection is silent, rank 0 stops accepting until the next poll() round; the
    // listener keeps the rest. Running out of descriptors (EMFILE, ENFILE) is handled alike: a
    // silent connection is pushed out to make room, and when none is, rank 0 stops accepting
    // until a connection leaves or kAcceptPause passed (polling the listener meanwhile would
    // return at once, its connections still pending, and spin).
    struct Introduction {
      int fd;
      int32_t hello[3];
      size_t got;  // bytes of `hello` received
      // Some poll() round since it was accepted reported nothing from it. Not cleared when a
      // later round reads part of an introduction: a rank sends its introduction whole, so a
      // connection that sends it piecemeal is not a rank, and is pushed out as readily.
      bool polled_silent;
    };
    std::vector<Introduction> waiting;
    const size_t max_waiting = static_cast<size_t>(world_size) + 64;
    std::vector<pollfd> polled;
    int joined = 0;
    int dropped = 0;  // connections that left, were pushed out, or were not kiln ranks
    // Of those, kiln processes of another bootstrap protocol that did not fit this rendezvous, and
    // the last one's rank, world size and protocol.
    int other_builds = 0;
    std::string last_other_build;
    // Accepting is paused until then (descriptors ran out and no connection was silent).
    constexpr absl::Duration kAcceptPause = absl::Milliseconds(2);
    absl::Time accept_paused_until = absl::InfinitePast();
    // accept4 failed with EMFILE or ENFILE since the last connection it accepted.
    bool out_of_descriptors = false;
    absl::Status status;
    auto too_late = [&]() {
      std::string waiting_for;
      if (waiting.size() == 1) {
        waiting_for = ", waiting for a connected process to introduce itself";
      } else if (waiting.size() > 1) {
        waiting_for = absl::StrFormat(
            ", waiting for %d connected processes to introduce themselves", waiting.size());
      }
      std::string dropped_text;
      if (dropped > 0) {
        dropped_text = absl::StrFormat(
            " (%d connection(s) dropped: closed before introducing themselves, pushed out by "
            "later ones while silent, or not kiln ranks",
            dropped);
        if (other_builds > 0) {
          absl::StrAppendFormat(&dropped_text,
                                "; %d of them kiln processes of another bootstrap protocol "
                                "whose rank or world size does not fit, the last as %s: is "
                                "another job at this path?",
                                other_builds, last_other_build);
        }
        dropped_text += ")";
      }
      return absl::DeadlineExceededError(absl::StrFormat(
          "Only %d of %d ranks joined the bootstrap at %s within %s%s%s; start every rank "
          "with the same path and world size%s",
          joined + 1, world_size, path, absl::FormatDuration(timeout), waiting_for, dropped_text,
          out_of_descriptors
              ? absl::StrFormat(". Rank 0 ran out of file descriptors while accepting "
                                "connections: raise its limit (ulimit -n) to leave about %d "
                                "free for the rendezvous (world size + 8)",
                                world_size + 8)
              : ""));
    };
    auto drop = [&](size_t i) {
      close(waiting[i].fd);
      waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
      ++dropped;
    };
    // Whether waiting[i] may be pushed out. A peek, not a read: bytes that came after the poll()
    // round stay for the next one, which reads them.
    auto silent = [&](size_t i) {
      if (!waiting[i].polled_silent) return false;
      char byte;
      return recv(waiting[i].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;  // none, closed or broken
    };
    while (status.ok() && joined < world_size - 1) {
      // While accepting is paused, the listener stays in the set (index 0) with no events.
      const bool accepting = absl::Now() >= accept_paused_until;
      polled.assign(1, pollfd{listener, static_cast<short>(accepting ? POLLIN : 0), 0});
      for (const Introduction& w : waiting) polled.push_back(pollfd{w.fd, POLLIN, 0});
      absl::StatusOr<bool> ready =
          WaitAnyReady(polled.data(), polled.size(),
                       accepting ? deadline : std::min(deadline, accept_paused_until));
      if (!ready.ok()) {
        status = ready.status();
        break;
      }
      if (!*ready && absl::Now() >= deadline) {
        status = too_late();
        break;
      }
      // Read what arrived (nothing when the pause ran out); backwards, so that removing entry i
      // leaves the ones before it (and their poll entries, i + 1) in place.
      const size_t held = static_cast<size_t>(joined) + waiting.size();
      for (size_t i = waiting.size(); status.ok() && i-- > 0;) {
        Introduction& w = waiting[i];
        if (polled[i + 1].revents == 0) {
          w.polled_silent = true;
          continue;
        }
        const ssize_t n =
            recv(w.fd, reinterpret_cast<char*>(w.hello) + w.got, sizeof(w.hello) - w.got, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) {
          drop(i);  // closed or broken before its introduction was complete: it holds no rank
          continue;
        }
        w.got += static_cast<size_t>(n);
        if (w.got < sizeof(w.hello)) continue;
        const int fd = w.fd;
        const int32_t magic = w.hello[0], joiner = w.hello[1], joiner_world = w.hello[2];
        waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i));
        const bool other_version =
            MagicVersionDiffers(static_cast<uint32_t>(magic), static_cast<uint32_t>(kHelloMagic));
        if (magic != kHelloMagic && !other_version) {
          close(fd);  // another program: not one of the ranks
          ++dropped;
          continue;
        }
        const bool fits = joiner_world == world_size && joiner >= 1 && joiner < world_size;
        if (other_version && (!fits || fds[joiner - 1] >= 0)) {
          // A kiln process of another build whose rank and world size are not this job's, or
          // whose rank already joined: most likely another job's, at the same path. It is told
          // why (best effort, without waiting: it must not hold up this rank) and dropped; this
          // job's ranks may still come.
          const std::string refusal = absl::StrFormat(
              "A process joined the bootstrap at %s as rank %d of %d speaking bootstrap protocol "
              "'%s', not this rank's '%s', and does not fit world size %d or names a rank that "
              "joined: the path is another job's; give every job its own path, and run the same "
              "build on every rank",
              path, joiner, joiner_world, MagicText(static_cast<uint32_t>(magic)),
              MagicText(static_cast<uint32_t>(kHelloMagic)), world_size);
          SendVerdict(fd, refusal, absl::Now()).IgnoreError();
          close(fd);
          ++dropped;
          ++other_builds;
          last_other_build = absl::StrFormat("rank %d of %d speaking '%s'", joiner, joiner_world,
                                             MagicText(static_cast<uint32_t>(magic)));
          continue;
        }
        if (other_version) {
          // A rank of this job from another kiln build: waiting on would only end in the
          // timeout, and every exchange with it would fail.
          status = absl::FailedPreconditionError(absl::StrFormat(
              "A process joined the bootstrap at %s as rank %d of %d speaking bootstrap protocol "
              "'%s', not this rank's '%s': it is a kiln build with another bootstrap protocol; "
              "run the same build on every rank",
              path, joiner, joiner_world, MagicText(static_cast<uint32_t>(magic)),
              MagicText(static_cast<uint32_t>(kHelloMagic))));
        } else if (!fits || fds[joiner - 1] >= 0) {
          status = absl::InvalidArgumentError(absl::StrFormat(
              "A process joined the bootstrap at %s as rank %d of %d, which does not fit world "
              "size %d or is taken; give every rank a distinct rank and the same world size",
              path, joiner, joiner_world, world_size));
        }
        if (!status.ok()) {
          // Tell the refused process why (best effort): it would otherwise take the closed
          // connection for an ordinary join and fail later, blaming a peer that exited.
          SendVerdict(fd, status.message(), deadline).IgnoreError();
          close(fd);
          break;
        }
        fds[joiner - 1] = fd;
        ++joined;
      }
      // A connection left (a descriptor is free again): accept again.
      if (static_cast<size_t>(joined) + waiting.size() < held) {
        accept_paused_until = absl::InfinitePast();
      }
      if (!status.ok() || joined == world_size - 1 || polled[0].revents == 0) continue;
      // Every connection the listener holds, while there is room or a silent one to push out.
      // waiting[0, pushable) were found not silent and stay so in this pass (bytes stay until
      // read; connections accepted in it go after them): the search goes on from `pushable`.
      size_t pushable = 0;
      auto find_silent = [&]() {
        while (pushable < waiting.size() && !silent(pushable)) ++pushable;
        return pushable < waiting.size();
      };
      auto push_out = [&]() {
        // Best effort, never blocking (nothing else was sent to it): a rank whose introduction
        // had not left yet reads it and connects again, also when its introduction then fails
        // to go through (the notice stays readable after the close).
        send(waiting[pushable].fd, &kConnectAgain, sizeof(kConnectAgain),
             MSG_DONTWAIT | MSG_NOSIGNAL);
        drop(pushable);
      };
      while (true) {
        if (waiting.size() == max_waiting && !find_silent()) break;
        int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // Not fatal: the descriptors (or socket memory) are the waiting connections' (a
            // flood), or the limit is close to world_size (host_bootstrap.h).
            if (errno == EMFILE || errno == ENFILE) out_of_descriptors = true;
            if (find_silent()) {
              push_out();
              continue;
            }
            accept_paused_until = absl::Now() + kAcceptPause;
            break;
          }
          if (errno != EAGAIN && errno != EWOULDBLOCK) status = ErrnoStatus("accept");
          break;
        }
        // Descriptors are free again: a later timeout is not theirs.
        out_of_descriptors = false;
        if (waiting.size() == max_waiting) push_out();
        waiting.push_back(Introduction{fd, {0, -1, -1}, 0, false});
      }
    }
    for (const Introduction& w : waiting) close(w.fd);
    close(listener);
    if (!abstract) unlink(path.c_str());
    for (size_t i = 0; status.ok() && i < fds.size(); ++i) {
      absl::StatusOr<bool> sent = SendVerdict(fds[i], "", deadline);
      if (!sent.ok() || !*sent) {
        status = absl::UnavailableError(absl::StrFormat(
            "Rank %d left the bootstrap at %s before every rank joined; start it again", i + 1,
            path));
      }
    }
    if (!status.ok()) {
      CloseAll(fds);  // the ranks that joined see the connection close and fail too
      return status;
    }
    return FromConnectedSockets(0, world_size, std::move(fds), timeout);
  }

  while (true) {
    // Non-blocking: a blocking connect to a listener whose backlog is full would wait past the
    // deadline; this one fails with EAGAIN and is retried.
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ErrnoStatus("socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) {
      std::vector<int> fds = {fd};
      int32_t hello[3] = {kHelloMagic, rank, world_size};
      absl::StatusOr<bool> sent =
          SendAll(fd, reinterpret_cast<const char*>(hello), sizeof(hello), deadline);
      // Rank 0 closed the connection before the introduction went through. What it queued
      // before closing stays readable: the notice when it pushed the connection out as silent,
      // nothing when it ended the rendezvous (it refused another rank or gave up).
      const bool closed_early = absl::IsUnavailable(sent.status());
      // Wait for rank 0's verdict: sent once every rank joined, or at once if it refused this
      // rank (a rank or world size that does not fit its own).
      uint32_t length = 0;
      absl::StatusOr<bool> got = sent;
      if (closed_early || (sent.ok() && *sent)) {
        got = ReceiveAll(fd, reinterpret_cast<char*>(&length), sizeof(length), deadline);
      }
      // Rank 0 accepted the connection before the introduction arrived and pushed it out as
      // silent.
      const bool pushed_out = got.ok() && *got && length == kConnectAgain;
      if (pushed_out && absl::Now() < deadline) {
        close(fd);
        continue;
      }
      if (pushed_out || (!closed_early && (!sent.ok() || !*sent))) {
        close(fd);
        return absl::DeadlineExceededError(absl::StrFormat(
            "Rank %d could not introduce itself to rank 0 at %s within %s", rank, path,
            absl::FormatDuration(timeout)));
      }
      std::string refusal(!closed_early && got.ok() && *got ? std::min<uint32_t>(length, 4096) : 0,
                          '\0');
      if (!refusal.empty()) got = ReceiveAll(fd, refusal.data(), refusal.size(), deadline);
      if (closed_early || !got.ok() || (*got && length > 0)) {
        close(fd);
        if (!closed_early && got.ok()) {
          // Escaped: the bytes are whatever listens at the path, not necessarily a kiln rank 0.
          return absl::InvalidArgumentError(
              absl::StrCat("Rank 0 refused: ", Printable(refusal)));
        }
        return absl::UnavailableError(absl::StrFormat(
            "Rank %d of %d: rank 0 at %s ended the rendezvous before every rank joined (it "
            "refused another rank or gave up) or dropped this rank's introduction (it is a kiln "
            "build with another bootstrap protocol); see its error, run the same build on every "
            "rank, and start every rank again",
            rank, world_size, path));
      }
      if (!*got) {
        close(fd);
        return absl::DeadlineExceededError(absl::StrFormat(
            "Rank %d joined rank 0 at %s, but not every one of the %d ranks joined within %s; "
            "start every rank with the same path and world size",
            rank, path, world_size, absl::FormatDuration(timeout)));
      }
      return FromConnectedSockets(rank, world_size, std::move(fds), timeout);
    }
    const int error = errno;
    close(fd);
    errno = error;
    if (errno != ENOENT && errno != ECONNREFUSED && errno != EINTR && errno != EAGAIN &&
        errno != EWOULDBLOCK) {
      return ErrnoStatus(absl::StrCat("connect to ", path));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "Rank %d found no rank 0 listening at %s within %s; start rank 0 with the same path",
          rank, path, absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

HostBootstrap::~HostBootstrap() { CloseAll(fds_); }

absl::Status HostBootstrap::Fail(absl::Status status) {
  if (broken_.ok()) {
    broken_ = status;
    // The ranks may now be at different points of the protocol: shut every connection so the
    // others learn at once (EOF) instead of waiting out their own timeouts.
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }
  return status;
}

namespace {

const char* ExchangeName(uint32_t kind) {
  switch (kind & ~kReplyBit) {
    case 1:
      return kind & kReplyBit ? "all-gather reply" : "all-gather";
    case 2:
      return "broadcast";
    case 3:
      return kind & kReplyBit ? "barrier reply" : "barrier";
    case 4:
      return kind & kReplyBit ? "agreement reply" : "agreement";
    case 5:
      return "call-mismatch report";
  }
  return "unknown exchange";
}

// A call's name for a message, escaped and quoted as the file quotes what peers send.
std::string CallText(absl::string_view call) {
  if (call.empty()) return "an unnamed call";
  return absl::StrCat("call '", absl::CHexEscape(call), "'");
}

// The error of every rank when, at exchange `sequence` (of kind `kind`), rank 0 made call
// `rank0_call` but rank `peer` made call `peer_call`.
absl::Status CallMismatch(int this_rank, uint64_t sequence, uint32_t kind,
                          absl::string_view rank0_call, int peer, absl::string_view peer_call) {
  return absl::InternalError(absl::StrFormat(
      "Bootstrap rank %d: at exchange %d (%s), rank 0 made %s but rank %d made %s; the ranks "
      "are out of step: one of them skipped a call or made one the others did not (every rank "
      "must make the same sequence of collective calls, named alike)",
      this_rank, sequence, ExchangeName(kind), CallText(rank0_call), peer, CallText(peer_call)));
}

}  // namespace

absl::StatusOr<absl::Time> HostBootstrap::BeginExchange(absl::string_view call) {
  RETURN_IF_ERROR(broken_);
  ++sequence_;
  if (absl::Status timeout = CheckTimeout(timeout_); !timeout.ok()) return Fail(timeout);
  if (call.size() > kMaxCallNameBytes) {
    // Refused on this rank, which breaks the exchange for all: the peers learn at once.
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap rank %d: call name '%s...' has %d bytes, over the limit of %d "
        "(HostBootstrap::kMaxCallNameBytes); name the call in fewer bytes",
        rank_, absl::CHexEscape(call.substr(0, 32)), call.size(), kMaxCallNameBytes)));
  }
  return absl::Now() + timeout_;
}

absl::Status HostBootstrap::SendFrame(int peer_index, Exchange kind, absl::string_view call,
                                      absl::string_view bytes, absl::Time deadline) {
  FrameHeader header{kFrameMagic, static_cast<uint32_t>(kind), sequence_, bytes.size(),
                     call.size()};
  if (rank_ == 0 && kind != Exchange::kBroadcast) header.kind |= kReplyBit;
  absl::StatusOr<bool> ok = SendAll(fds_[peer_index], reinterpret_cast<const char*>(&header),
                                    sizeof(header), deadline);
  if (ok.ok() && *ok) ok = SendAll(fds_[peer_index], call.data(), call.size(), deadline);
  if (ok.ok() && *ok) ok = SendAll(fds_[peer_index], bytes.data(), bytes.size(), deadline);
  if (!ok.ok()) {
    // Rank 0 shuts its connections once it reported a call-name mismatch to every rank: its
    // report, when one waits unread, says why this rank could not send. Any other frame that
    // waits (rank 0's data of another exchange) is left: the lost connection is the error.
    FrameHeader next{};
    if (rank_ != 0 &&
        recv(fds_[0], &next, sizeof(next), MSG_PEEK | MSG_DONTWAIT) ==
            static_cast<ssize_t>(sizeof(next)) &&
        next.magic == kFrameMagic && next.kind == static_cast<uint32_t>(Exchange::kCallMismatch)) {
      // A report always ends in an error (its own, or a malformed report's); were it read as
      // OK, the lost connection would still be the error.
      const absl::Status report = ReceiveFrame(0, kind, call, 0, deadline).status();
      if (!report.ok()) return report;
    }
    return Fail(absl::UnavailableError(absl::StrFormat(
        "Bootstrap rank %d could not send to rank %d (%s); did that process exit?", rank_,
        PeerRank(peer_index), ok.status().message())));
  }
  if (!*ok) {
    return Fail(absl::DeadlineExceededError(absl::StrFormat(
        "Bootstrap rank %d: rank %d did not accept data within %s; it is stuck or behind",
        rank_, PeerRank(peer_index), absl::FormatDuration(timeout_))));
  }
  return absl::OkStatus();
}

void HostBootstrap::SendCallMismatch(int peer, absl::string_view peer_call, Exchange kind,
                                     absl::string_view call, absl::Time deadline) {
  const int32_t odd = peer;
  const uint32_t rank0_kind = static_cast<uint32_t>(kind);
  std::string payload(reinterpret_cast<const char*>(&odd), sizeof(odd));
  payload.append(reinterpret_cast<const char*>(&rank0_kind), sizeof(rank0_kind));
  payload.append(peer_call.data(), peer_call.size());
  const FrameHeader header{kFrameMagic, static_cast<uint32_t>(Exchange::kCallMismatch), sequence_,
                           payload.size(), call.size()};
  std::string frame(reinterpret_cast<const char*>(&header), sizeof(header));
  frame.append(call.data(), call.size());
  frame.append(payload);
  // To every peer at once, for at most report_wait_: the report is an explanation, and a peer
  // that reads nothing must not hold up this rank's error. A connection that stays full gets
  // none of it, or part of it, before it is shut.
  const absl::Time until = std::min(deadline, absl::Now() + report_wait_);
  std::vector<size_t> sent(fds_.size(), 0);
  std::vector<pollfd> full;
  while (true) {
    full.clear();
    for (size_t i = 0; i < fds_.size(); ++i) {
      while (sent[i] < frame.size()) {
        const ssize_t n =
            send(fds_[i], frame.data() + sent[i], frame.size() - sent[i], MSG_NOSIGNAL);
        if (n > 0) {
          sent[i] += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          full.push_back(pollfd{fds_[i], POLLOUT, 0});
        } else {
          sent[i] = frame.size();  // the connection is gone: there is no one to tell
        }
        break;
      }
    }
    if (full.empty()) return;
    absl::StatusOr<bool> ready = WaitAnyReady(full.data(), full.size(), until);
    if (!ready.ok() || !*ready) return;
  }
}

absl::StatusOr<std::string> HostBootstrap::ReceiveFrame(int peer_index, Exchange kind,
                                                        absl::string_view call, uint64_t max_bytes,
                                                        absl::Time deadline) {
  const int peer = PeerRank(peer_index);
  const int fd = fds_[peer_index];
  FrameHeader header{};
  // The magic first: a peer of another protocol version may send fewer bytes than a header,
  // and must be told apart at once, not waited for.
  absl::StatusOr<bool> ok = ReceiveAll(fd, reinterpret_cast<char*>(&header.magic),
                                       sizeof(header.magic), deadline);
  if (ok.ok() && *ok && header.magic != kFrameMagic) {
    if (MagicVersionDiffers(header.magic, kFrameMagic)) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d got a frame of bootstrap protocol '%s' from rank %d, not this "
          "rank's '%s': that rank is a kiln build with another bootstrap protocol; run the same "
          "build on every rank",
          rank_, MagicText(header.magic), peer, MagicText(kFrameMagic))));
    }
    return Fail(absl::InternalError(absl::StrFormat(
        "Bootstrap rank %d got bytes from rank %d that are not a bootstrap frame (header "
        "starts %08x, not %08x); the peer is not a kiln bootstrap of this version, or the "
        "connection carries other data",
        rank_, peer, header.magic, kFrameMagic)));
  }
  if (ok.ok() && *ok) {
    ok = ReceiveAll(fd, reinterpret_cast<char*>(&header) + sizeof(header.magic),
                    sizeof(header) - sizeof(header.magic), deadline);
  }
  std::string their_call;
  std::string out;
  // Rank 0's report, in place of its reply, that some rank made a call of another name.
  bool report = false;
  if (ok.ok() && *ok) {
    uint32_t want_kind = static_cast<uint32_t>(kind);
    if (rank_ != 0 && kind != Exchange::kBroadcast) want_kind |= kReplyBit;
    report = rank_ != 0 && header.kind == static_cast<uint32_t>(Exchange::kCallMismatch) &&
             header.sequence == sequence_;
    if (!report && (header.kind != want_kind || header.sequence != sequence_)) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d is at exchange %d (%s) but rank %d sent exchange %d (%s); the ranks "
          "are out of step: every rank must make the same sequence of collective calls "
          "(AllGather, Broadcast, Barrier, AllAgree)",
          rank_, sequence_, ExchangeName(want_kind), peer, header.sequence,
          ExchangeName(header.kind))));
    }
    const uint32_t got_kind = report ? header.kind : want_kind;
    if (header.call_size > kMaxCallNameBytes) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d: rank %d announced a %d-byte call name in a %s frame, over the "
          "limit of %d bytes (HostBootstrap::kMaxCallNameBytes); the peer is corrupt or not a "
          "kiln bootstrap of this version",
          rank_, peer, header.call_size, ExchangeName(got_kind), kMaxCallNameBytes)));
    }
    their_call.resize(header.call_size);
    ok = ReceiveAll(fd, their_call.data(), their_call.size(), deadline);
    if (ok.ok() && *ok && !report && their_call != call) {
      // The same kind and number but another call: one of the two ranks skipped a call or made
      // one the other did not. Rank 0 tells every rank, so none waits for a call that will not
      // come. A peer finds one itself only in the data of rank 0's unnamed Broadcast, where its
      // own is named: it fails alone, and rank 0 learns at its next exchange.
      if (rank_ == 0) {
        SendCallMismatch(peer, their_call, kind, call, deadline);
        return Fail(
            CallMismatch(rank_, sequence_, static_cast<uint32_t>(kind), call, peer, their_call));
      }
      return Fail(
          CallMismatch(rank_, sequence_, static_cast<uint32_t>(kind), their_call, rank_, call));
    }
    // A report holds a rank, rank 0's exchange kind and that rank's call name.
    const uint64_t limit =
        report ? sizeof(int32_t) + sizeof(uint32_t) + kMaxCallNameBytes : max_bytes;
    if (ok.ok() && *ok && header.size > limit) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d: rank %d announced a %d-byte %s frame, over the limit of %d bytes "
          "for it; the peer is corrupt or not a kiln bootstrap of this version",
          rank_, peer, header.size, ExchangeName(got_kind), limit)));
    }
    // Grow with what arrives: a header is only a claim.
    while (ok.ok() && *ok && out.size() < header.size) {
      const uint64_t have = out.size();
      const uint64_t chunk =
          std::min<uint64_t>(header.size - have, std::max<uint64_t>(have, kFirstChunkBytes));
      out.resize(have + chunk);
      ok = ReceiveAll(fd, out.data() + have, chunk, deadline);
    }
  }
  if (!ok.ok()) {
    return Fail(absl::UnavailableError(absl::StrFormat(
        "Bootstrap rank %d lost rank %d (%s); did that process exit?", rank_, peer,
        ok.status().message())));
  }
  if (!*ok) {
    return Fail(absl::DeadlineExceededError(absl::StrFormat(
        "Bootstrap rank %d: rank %d did not answer within %s; it is stuck, behind, or making "
        "a different sequence of collective calls",
        rank_, peer, absl::FormatDuration(timeout_))));
  }
  if (report) {
    // The exchange is rank 0's: this rank may be at another kind of call.
    int32_t odd = -1;
    uint32_t rank0_kind = 0;
    if (out.size() >= sizeof(odd) + sizeof(rank0_kind)) {
      std::memcpy(&odd, out.data(), sizeof(odd));
      std::memcpy(&rank0_kind, out.data() + sizeof(odd), sizeof(rank0_kind));
    }
    const bool known_kind = rank0_kind >= static_cast<uint32_t>(Exchange::kAllGather) &&
                            rank0_kind <= static_cast<uint32_t>(Exchange::kAgree);
    if (odd < 1 || odd >= world_size_ || !known_kind) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d got a malformed call-mismatch report from rank 0 (%d bytes, rank "
          "%d of %d, exchange kind %d); rank 0 is corrupt or not a kiln bootstrap of this "
          "version",
          rank_, out.size(), odd, world_size_, rank0_kind)));
    }
    return Fail(CallMismatch(rank_, sequence_, rank0_kind, their_call, odd,
                             absl::string_view(out).substr(sizeof(odd) + sizeof(rank0_kind))));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> HostBootstrap::Gather(Exchange kind,
                                                               absl::string_view call,
                                                               absl::string_view mine,
                                                               uint64_t max_each) {
  ASSIGN_OR_RETURN(const absl::Time deadline, BeginExchange(call));
  if (mine.size() > kMaxMessageBytes) {
    // Refused on this rank, which breaks the exchange for all: the peers learn at once.
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap rank %d cannot bring %d bytes to one exchange; the limit is %d "
        "(HostBootstrap::kMaxMessageBytes): exchange less, or split it",
        rank_, mine.size(), kMaxMessageBytes)));
  }
  std::vector<std::string> all(world_size_);
  if (rank_ == 0) {
    all[0] = std::string(mine);
    for (int i = 0; i + 1 < world_size_; ++i) {
      ASSIGN_OR_RETURN(all[i + 1], ReceiveFrame(i, kind, call, max_each, deadline));
    }
    std::string packed;
    for (const std::string& s : all) {
      uint64_t size = s.size();
      packed.append(reinterpret_cast<const char*>(&size), sizeof(size));
      packed.append(s);
    }
    for (int i = 0; i + 1 < world_size_; ++i) {
      RETURN_IF_ERROR(SendFrame(i, kind, call, packed, deadline));
    }
    return all;
  }
  RETURN_IF_ERROR(SendFrame(0, kind, call, mine, deadline));
  // world_size_ <= kMaxWorldSize and max_each <= kMaxMessageBytes: no overflow.
  const uint64_t max_reply = static_cast<uint64_t>(world_size_) * (8 + max_each);
  ASSIGN_OR_RETURN(std::string packed, ReceiveFrame(0, kind, call, max_reply, deadline));
  // Exactly world_size_ records of [uint64 size][size bytes], nothing after; this rank's is
  // what it sent. Compared by subtraction: a size near 2^64 must not wrap past the end.
  size_t pos = 0;
  int r = 0;
  for (; r < world_size_; ++r) {
    uint64_t size = 0;
    if (packed.size() - pos < sizeof(size)) break;
    std::memcpy(&size, packed.data() + pos, sizeof(size));
    pos += sizeof(size);
    if (size > packed.size() - pos) break;
    all[r] = packed.substr(pos, size);
    pos += size;
  }
  if (r != world_size_ || pos != packed.size() || all[rank_] != mine) {
    return Fail(absl::InternalError(absl::StrFormat(
        "Bootstrap rank %d got a malformed %s reply from rank 0 (%d bytes: %d of %d records "
        "whole, %d bytes left over%s); rank 0 is corrupt or not a kiln bootstrap of this "
        "version",
        rank_, ExchangeName(static_cast<uint32_t>(kind)), packed.size(), r, world_size_,
        packed.size() - pos,
        r == world_size_ && all[rank_] != mine ? ", this rank's record changed" : "")));
  }
  return all;
}

absl::StatusOr<std::vector<std::string>> HostBootstrap::AllGather(absl::string_view mine,
                                                                  absl::string_view call) {
  return Gather(Exchange::kAllGather, call, mine, kMaxMessageBytes);
}

absl::StatusOr<std::string> HostBootstrap::Broadcast(absl::string_view data,
                                                     absl::string_view call) {
  ASSIGN_OR_RETURN(const absl::Time deadline, BeginExchange(call));
  // A named broadcast starts with every peer's announcement of its call (an empty frame), so
  // that rank 0 compares the names, and reports a mismatch to every rank, before any data goes.
  const bool announced = !call.empty();
  if (rank_ == 0) {
    if (data.size() > kMaxMessageBytes) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "Bootstrap rank 0 cannot broadcast %d bytes; the limit is %d "
          "(HostBootstrap::kMaxMessageBytes): broadcast less, or split it",
          data.size(), kMaxMessageBytes)));
    }
    for (int i = 0; announced && i + 1 < world_size_; ++i) {
      RETURN_IF_ERROR(ReceiveFrame(i, Exchange::kBroadcast, call, 0, deadline).status());
    }
    for (int i = 0; i + 1 < world_size_; ++i) {
      RETURN_IF_ERROR(SendFrame(i, Exchange::kBroadcast, call, data, deadline));
    }
    return std::string(data);
  }
  if (announced) RETURN_IF_ERROR(SendFrame(0, Exchange::kBroadcast, call, "", deadline));
  return ReceiveFrame(0, Exchange::kBroadcast, call, kMaxMessageBytes, deadline);
}

absl::Status HostBootstrap::Barrier(absl::string_view call) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, Gather(Exchange::kBarrier, call, "", 0));
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d: rank %d brought %d bytes to a barrier, which carries none; that "
          "peer is corrupt or not a kiln bootstrap of this version",
          rank_, r, all[r].size())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> HostBootstrap::AllAgree(bool ok, absl::string_view call) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, Gather(Exchange::kAgree, call, ok ? "1" : "0", 1));
  bool agreed = true;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] != "0" && all[r] != "1") {
      // Not a vote: read as neither yes nor no.
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d: rank %d's agreement vote is %d bytes '%s', not '0' or '1'; that "
          "peer is corrupt or not a kiln bootstrap of this version",
          rank_, r, all[r].size(), absl::CHexEscape(all[r].substr(0, 16)))));
    }
    agreed = agreed && all[r] == "1";
  }
  return agreed;
}

}  // namespace kiln
