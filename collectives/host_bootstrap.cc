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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// Waits until `fd` is ready for `events` or `deadline` passes. Returns false on timeout.
absl::StatusOr<bool> WaitReady(int fd, short events, absl::Time deadline) {
  while (true) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, events, 0};
    // poll takes an int: a wait of 2^31 ms (24.9 days) or more, an infinite timeout included,
    // would wrap to a negative value (wait forever, past the deadline) or to 0 (spin). Wait at
    // most a day at a time; the loop checks the deadline again.
    constexpr int64_t kMaxPollMs = 24 * 60 * 60 * 1000;
    const int ms = static_cast<int>(std::min(absl::ToInt64Milliseconds(left), kMaxPollMs - 1) + 1);
    int n = poll(&p, 1, ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll");
    }
    if (n > 0) return true;
  }
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
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d of world size %d is out of range; pass 0 <= rank < world_size", rank,
        world_size));
  }
  return absl::OkStatus();
}

// Rank 0's verdict on a joining rank, sent once every rank joined (or at once, to a rank it
// refuses): a uint32 length and that many bytes of the reason it refused, none when accepted.
absl::StatusOr<bool> SendVerdict(int fd, absl::string_view refusal, absl::Time deadline) {
  const uint32_t length = static_cast<uint32_t>(refusal.size());
  ASSIGN_OR_RETURN(bool sent, SendAll(fd, reinterpret_cast<const char*>(&length), sizeof(length),
                                      deadline));
  if (!sent || refusal.empty()) return sent;
  return SendAll(fd, refusal.data(), refusal.size(), deadline);
}

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
  size_t expected = rank == 0 ? static_cast<size_t>(world_size - 1) : 1;
  if (shape.ok() && fds.size() != expected) {
    shape = absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d of %d needs %d connected sockets, got %d", rank, world_size, expected,
        fds.size()));
  }
  for (int fd : fds) {
    if (!shape.ok()) break;
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
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Bootstrap socket path '%s' must have 1 to %d characters; use a shorter directory or "
        "an abstract name ('@name')",
        path, sizeof(addr.sun_path) - 1));
  }
  // "@name" is Linux's abstract namespace: no file to create or remove.
  const bool abstract = path[0] == '@';
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
    int joined = 0;
    absl::Status status;
    while (status.ok() && joined < world_size - 1) {
      absl::StatusOr<bool> ready = WaitReady(listener, POLLIN, deadline);
      if (!ready.ok()) {
        status = ready.status();
        break;
      }
      if (!*ready) {
        status = absl::DeadlineExceededError(absl::StrFormat(
            "Only %d of %d ranks joined the bootstrap at %s within %s; start every rank "
            "with the same path and world size",
            joined + 1, world_size, path, absl::FormatDuration(timeout)));
        break;
      }
      int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        status = ErrnoStatus("accept");
        break;
      }
      int32_t hello[2] = {-1, -1};
      absl::Status nb = SetNonBlocking(fd);
      absl::StatusOr<bool> got =
          nb.ok() ? ReceiveAll(fd, reinterpret_cast<char*>(hello), sizeof(hello), deadline)
                  : absl::StatusOr<bool>(nb);
      if (!got.ok() || !*got || hello[1] != world_size || hello[0] < 1 ||
          hello[0] >= world_size || fds[hello[0] - 1] >= 0) {
        status = absl::InvalidArgumentError(absl::StrFormat(
            "A process joined the bootstrap at %s as rank %d of %d, which does not fit world "
            "size %d or is taken; give every rank a distinct rank and the same world size",
            path, hello[0], hello[1], world_size));
        // Tell the refused process why (best effort): it would otherwise take the closed
        // connection for an ordinary join and fail later, blaming a peer that exited.
        if (got.ok() && *got) SendVerdict(fd, status.message(), deadline).IgnoreError();
        close(fd);
        break;
      }
      fds[hello[0] - 1] = fd;
      ++joined;
    }
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
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus("socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) {
      absl::Status nb = SetNonBlocking(fd);
      if (!nb.ok()) {
        close(fd);
        return nb;
      }
      std::vector<int> fds = {fd};
      int32_t hello[2] = {rank, world_size};
      absl::StatusOr<bool> sent =
          SendAll(fd, reinterpret_cast<const char*>(hello), sizeof(hello), deadline);
      if (!sent.ok() || !*sent) {
        close(fd);
        return absl::DeadlineExceededError(absl::StrFormat(
            "Rank %d could not introduce itself to rank 0 at %s within %s", rank, path,
            absl::FormatDuration(timeout)));
      }
      // Wait for rank 0's verdict: sent once every rank joined, or at once if it refused this
      // rank (a rank or world size that does not fit its own).
      uint32_t length = 0;
      absl::StatusOr<bool> got =
          ReceiveAll(fd, reinterpret_cast<char*>(&length), sizeof(length), deadline);
      std::string refusal(got.ok() && *got ? std::min<uint32_t>(length, 4096) : 0, '\0');
      if (!refusal.empty()) got = ReceiveAll(fd, refusal.data(), refusal.size(), deadline);
      if (!got.ok() || (*got && length > 0)) {
        close(fd);
        if (got.ok()) return absl::InvalidArgumentError(absl::StrCat("Rank 0 refused: ", refusal));
        return absl::UnavailableError(absl::StrFormat(
            "Rank %d of %d: rank 0 at %s ended the rendezvous before every rank joined (it "
            "refused another rank or gave up); see its error, and start every rank again",
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
    close(fd);
    if (errno != ENOENT && errno != ECONNREFUSED && errno != EINTR) {
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

absl::Status HostBootstrap::SendFrame(int peer_index, absl::string_view bytes,
                                      absl::Time deadline) {
  uint64_t size = bytes.size();
  char header[sizeof(size)];
  std::memcpy(header, &size, sizeof(size));
  absl::StatusOr<bool> ok = SendAll(fds_[peer_index], header, sizeof(header), deadline);
  if (ok.ok() && *ok) ok = SendAll(fds_[peer_index], bytes.data(), bytes.size(), deadline);
  if (!ok.ok()) {
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

absl::StatusOr<std::string> HostBootstrap::ReceiveFrame(int peer_index, absl::Time deadline) {
  uint64_t size = 0;
  absl::StatusOr<bool> ok =
      ReceiveAll(fds_[peer_index], reinterpret_cast<char*>(&size), sizeof(size), deadline);
  std::string out;
  if (ok.ok() && *ok) {
    if (size > (uint64_t{1} << 32)) {
      return Fail(absl::InternalError(absl::StrFormat(
          "Bootstrap rank %d got a %d-byte frame from rank %d; the ranks are out of step",
          rank_, size, PeerRank(peer_index))));
    }
    out.resize(size);
    ok = ReceiveAll(fds_[peer_index], out.data(), out.size(), deadline);
  }
  if (!ok.ok()) {
    return Fail(absl::UnavailableError(absl::StrFormat(
        "Bootstrap rank %d lost rank %d (%s); did that process exit?", rank_,
        PeerRank(peer_index), ok.status().message())));
  }
  if (!*ok) {
    return Fail(absl::DeadlineExceededError(absl::StrFormat(
        "Bootstrap rank %d: rank %d did not answer within %s; it is stuck, behind, or making "
        "a different sequence of collective calls",
        rank_, PeerRank(peer_index), absl::FormatDuration(timeout_))));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> HostBootstrap::AllGather(absl::string_view mine) {
  RETURN_IF_ERROR(broken_);
  const absl::Time deadline = absl::Now() + timeout_;
  std::vector<std::string> all(world_size_);
  if (rank_ == 0) {
    all[0] = std::string(mine);
    for (int i = 0; i + 1 < world_size_; ++i) {
      ASSIGN_OR_RETURN(all[i + 1], ReceiveFrame(i, deadline));
    }
    std::string packed;
    for (const std::string& s : all) {
      uint64_t size = s.size();
      packed.append(reinterpret_cast<const char*>(&size), sizeof(size));
      packed.append(s);
    }
    for (int i = 0; i + 1 < world_size_; ++i) RETURN_IF_ERROR(SendFrame(i, packed, deadline));
    return all;
  }
  RETURN_IF_ERROR(SendFrame(0, mine, deadline));
  ASSIGN_OR_RETURN(std::string packed, ReceiveFrame(0, deadline));
  size_t pos = 0;
  for (int r = 0; r < world_size_; ++r) {
    uint64_t size = 0;
    if (pos + sizeof(size) > packed.size()) break;
    std::memcpy(&size, packed.data() + pos, sizeof(size));
    pos += sizeof(size);
    if (pos + size > packed.size()) break;
    all[r] = packed.substr(pos, size);
    pos += size;
  }
  if (pos != packed.size()) {
    return Fail(absl::InternalError(absl::StrFormat(
        "Bootstrap rank %d got a malformed all-gather reply from rank 0", rank_)));
  }
  return all;
}

absl::StatusOr<std::string> HostBootstrap::Broadcast(absl::string_view data) {
  RETURN_IF_ERROR(broken_);
  const absl::Time deadline = absl::Now() + timeout_;
  if (rank_ == 0) {
    for (int i = 0; i + 1 < world_size_; ++i) RETURN_IF_ERROR(SendFrame(i, data, deadline));
    return std::string(data);
  }
  return ReceiveFrame(0, deadline);
}

absl::Status HostBootstrap::Barrier() { return AllGather("").status(); }

absl::StatusOr<bool> HostBootstrap::AllAgree(bool ok) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, AllGather(ok ? "1" : "0"));
  for (const std::string& s : all) {
    if (s != "1") return false;
  }
  return true;
}

}  // namespace kiln
