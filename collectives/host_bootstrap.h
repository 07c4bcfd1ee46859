// Host-side rendezvous of the processes of one host (one per GPU): exchanges the NCCL unique id,
// CUDA IPC handles and agreement flags, with a deadline on every exchange. Nothing leaves the
// host: the transport is Unix-domain stream sockets, in a star around rank 0.
//
//   // Processes started independently (one per GPU) meet at a socket path:
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::HostBootstrap> boot,
//                    kiln::HostBootstrap::Rendezvous("/tmp/kiln-job-42.sock", rank, world,
//                                                    absl::Seconds(60)));
//   ASSIGN_OR_RETURN(std::vector<std::string> all,
//                    boot->AllGather(my_ipc_handle_bytes, "my_component.ipc_handles"));
//
//   // A launcher that forks the processes itself hands them connected sockets instead:
//   ... = kiln::HostBootstrap::FromConnectedSockets(rank, world, fds, absl::Seconds(60));
//
// Every exchange either completes or fails within the timeout: a peer that never answers is
// DeadlineExceeded, a peer whose process exited (its socket closed) is Unavailable; both name
// the peer. Every frame carries its exchange's kind, its sequence number (the count of calls its
// rank made) and its call name: the optional last argument of every exchange (at most
// kMaxCallNameBytes bytes, compared byte for byte; an unnamed call sends none). The name travels
// whole, not as a hash, so that every rank's error can quote both names.
// A peer at a call of another kind or number, or that sends bytes that are not a frame (or a frame
// over the size limit, or of another kiln build's bootstrap protocol), is Internal naming it on
// every rank that reads such a frame; the others then find the connections shut (Unavailable). A
// peer at a call of the same kind and number but another name is Internal naming both ranks and
// both names, on rank 0 and every rank its report reaches: rank 0 compares every rank's call name
// with its own before it replies, and reports the mismatch (with its own exchange's kind) to every
// other rank before it shuts its connections (a named Broadcast therefore waits until every rank
// announced its call, then rank 0 sends the data; an unnamed one only sends from rank 0). For a
// peer whose connection is full (it has not read rank 0's earlier data, such as the tail of a
// broadcast) rank 0 waits at most 100 ms for room; a peer that reads nothing within that gets no
// report, or part of one, and fails with Unavailable instead (it lost rank 0, or could not send
// to it).
// So a rank that skips a named call is caught at once, at its next call, when that call's kind or
// name differs from the skipped one's, unless that call is an unnamed Broadcast (see below). Every
// call in kiln's code and tests is named after its call site (the tests of this file and one
// unnamed call in runtime/runner/rank_agreement_test.cc, made so on purpose, aside), and a
// site that runs once per item of a loop names that item and those of the loops around it (the
// runner's per-size capture barrier and agreement name the graph set and the capture key,
// "runner.capture_size.piece/3.decode/8"; the all-reduce benchmark's barriers name the mode,
// algorithm, size and sample).
// Calls of one kind and name that still follow each other: the custom all-reduce's capture
// agreements (their data carry the slot, which every rank checks), the test helpers SharedSeed and
// RanksDisagreeing (collectives/testing/rank_rig.h) when a test calls one twice in a row, and a
// kiln operation that a caller repeats with no other call between (two NcclCommunicator::Create in
// a row each broadcast "nccl_communicator.unique_id"). A count of a rank's own calls in the name
// would not tell a skip: it advances only with the calls that rank makes, as the sequence number
// does.
// Not caught by names: a skip among unnamed calls, or among calls of one kind and name that
// follow each other. There its calls pair with the others' earlier ones and are numbered alike, so
// no frame tells the skip: its bytes are read as the skipped exchange's, and the ranks part only
// at the first call whose kind or name differs (Internal) or at the end, where the others' last
// call waits out its timeout (DeadlineExceeded there, Unavailable on the ranks it then shuts
// out). Callers that exchange different data through calls of one kind and name check what they
// receive (custom_allreduce.cc sends slot numbers with its graph inputs). Name a call alike on
// every rank: a named call paired with an unnamed one is a mismatch too, on every rank, except in
// a Broadcast: a peer whose Broadcast is named where rank 0's is not fails alone (rank 0 learns at
// its next exchange), and rank 0's named Broadcast waits out its timeout for a peer whose unnamed
// one announces nothing (DeadlineExceeded). Likewise a peer that skipped a named call and next
// makes an unnamed Broadcast sends no frame: rank 0, at the skipped call, waits out its timeout
// (DeadlineExceeded; the peers then find the connections shut, Unavailable, unless their own
// timeouts came first). A rank 0 that skipped a named call and next makes an unnamed Broadcast
// returns once it sent the data: the peers fail at once (Internal), rank 0 at its next exchange.
// After any such error the bootstrap is unusable (the ranks may be at different points of the
// protocol): it shuts its connections, so the other ranks fail at once too, and every later call
// returns the same error.
// Exchanges are collective: every rank calls the same sequence. Not thread-safe; not a CUDA API,
// so legal during graph capture.
#ifndef KILN_COLLECTIVES_HOST_BOOTSTRAP_H_
#define KILN_COLLECTIVES_HOST_BOOTSTRAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

class HostBootstrap {
 public:
  // The largest world size: rank 0 keeps one socket per peer (one host's processes, one per
  // GPU, are far fewer; the bound keeps a wrong world size from reserving absurd memory).
  static constexpr int kMaxWorldSize = 1024;

  // The most bytes one rank may bring to one exchange (AllGather's `mine`, Broadcast's `data`).
  // A peer's frame header that announces more is refused before anything is allocated, and a
  // frame's memory grows only as its bytes arrive.
  static constexpr size_t kMaxMessageBytes = size_t{256} << 20;

  // The most bytes of a call name (the `call` argument of every exchange). A longer name is
  // InvalidArgument on the rank that passes it (breaking the bootstrap, as every exchange error
  // does); a peer's frame that announces one is Internal.
  static constexpr size_t kMaxCallNameBytes = 256;

  // Connects `world_size` processes through a Unix-domain socket at `path` (at most 107
  // characters, no NUL byte; "@name" names an abstract socket, which leaves no file behind).
  // Rank 0 creates the socket (replacing a stale file) and removes it once everyone joined; the
  // others retry connecting until `timeout` passes. Returns on every rank once all joined.
  // InvalidArgument for a bad rank, world size (1..kMaxWorldSize), path or timeout (positive),
  // and on both rank 0 and the joining process when that process brings a rank or world size
  // that does not fit rank 0's (taken, out of range, another world size); the ranks that had
  // joined then get Unavailable. A connection that closes before introducing itself, or
  // introduces itself as something other than a kiln rank, is dropped and rank 0 keeps
  // waiting. Rank 0 reads the introductions of all its accepted connections at once (poll), so
  // one that stays silent holds up no rank; at most world_size + 64 connections wait for their
  // introduction at a time. Past that, a new one pushes out the one that waited longest among
  // those a poll() round found silent and that have nothing to read (never one whose
  // introduction waits unread), and tells it to connect again: a rank whose introduction had not
  // arrived yet does so. A joining rank whose connection rank 0 closes without that notice gets
  // Unavailable at once. DeadlineExceeded when not everyone joined in time.
  // FailedPrecondition on rank 0 when a process introduces itself with a rank and world size
  // that fit but another bootstrap protocol version (another kiln build), which is told why. One
  // of another version whose rank or world size does not fit (most likely a process of another
  // job at the same path) is told why and dropped, and rank 0 keeps waiting; its
  // DeadlineExceeded names such processes. A joining process that rank 0 refuses gets
  // InvalidArgument quoting rank 0's reason, escaped. Versions are compared only where rank 0's
  // build checks them, as this one does: a rank 0 whose build does not drops the introduction of
  // another version as another program's, and the joining rank then gets Unavailable saying so.
  // Descriptors: rank 0 holds its listener, one socket per joined rank and the connections
  // waiting for their introduction, so world_size ranks need about world_size + 8 free
  // descriptors on rank 0 (ulimit -n; a soft limit of 1024 is common, too few near
  // kMaxWorldSize); a joining rank needs one. When rank 0 runs out while accepting (EMFILE,
  // ENFILE, or ENOBUFS and ENOMEM for socket memory), it pushes out a silent connection to make
  // room, or else stops accepting until a connection leaves or a few milliseconds passed; that
  // never fails the rendezvous, and a rank
  // it could never accept ends it in DeadlineExceeded saying so (descriptors only when it ran
  // out of them after the last connection it accepted).
  static absl::StatusOr<std::unique_ptr<HostBootstrap>> Rendezvous(const std::string& path,
                                                                   int rank, int world_size,
                                                                   absl::Duration timeout);

  // Wraps sockets that are already connected in a star: rank 0 passes world_size - 1 sockets,
  // the one at index i leading to rank i + 1; every other rank passes one socket leading to
  // rank 0. Takes ownership of the descriptors (closed on destruction, also on error).
  // InvalidArgument for a bad rank, world size, socket count or timeout (positive).
  static absl::StatusOr<std::unique_ptr<HostBootstrap>> FromConnectedSockets(
      int rank, int world_size, std::vector<int> fds, absl::Duration timeout);

  ~HostBootstrap();
  HostBootstrap(const HostBootstrap&) = delete;
  HostBootstrap& operator=(const HostBootstrap&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Sets the deadline applied to each later exchange (measured from the exchange's start). A
  // timeout that is not positive makes the next exchange fail with InvalidArgument (and, like
  // every exchange error, breaks the bootstrap).
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }
  absl::Duration timeout() const { return timeout_; }

  // Every exchange takes the name of the call, `call`: empty (unnamed) or up to
  // kMaxCallNameBytes bytes (InvalidArgument above), the same on every rank at that point of the
  // sequence (Internal on every rank otherwise; see the file comment). Name each call site
  // distinctly ("my_component.ipc_handles") so a rank that skips a call is caught at the next,
  // and a site in a loop by its item too ("my_component.step.decode/8").

  // Gathers one byte string from every rank (lengths may differ, at most kMaxMessageBytes;
  // InvalidArgument above) and returns them in rank order on every rank.
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view mine,
                                                     absl::string_view call = {});

  // Returns rank 0's `data` (at most kMaxMessageBytes) on every rank (the argument is ignored
  // on the others). Named, rank 0 waits until every rank announced its call before it sends;
  // unnamed, rank 0 sends and returns without waiting for the others.
  absl::StatusOr<std::string> Broadcast(absl::string_view data, absl::string_view call = {});

  // Returns once every rank has called Barrier.
  absl::Status Barrier(absl::string_view call = {});

  // Returns true on every rank if `ok` is true on every rank: the agreement step that keeps the
  // ranks on the same path when a local step failed on some of them.
  absl::StatusOr<bool> AllAgree(bool ok, absl::string_view call = {});

 private:
  // What an exchange is; every frame names it, so ranks at different calls are told apart.
  enum class Exchange : uint32_t {
    kAllGather = 1,
    kBroadcast = 2,
    kBarrier = 3,
    kAgree = 4,
    // Rank 0's report, sent to every peer in place of its reply, that a peer made a call of
    // another name: rank 0's call name in the frame's name, then that peer's rank (int32), rank
    // 0's exchange kind (uint32) and that peer's call name as the payload.
    kCallMismatch = 5,
  };

  // Sets report_wait_ (host_bootstrap_test.cc).
  friend class HostBootstrapTestPeer;

  // How long rank 0 waits for room in the connections of the peers it reports a call-name
  // mismatch to (SendCallMismatch): a peer that has not read rank 0's earlier data yet (the tail
  // of a broadcast) usually reads it within this; one that does not must not hold up rank 0's
  // error.
  static constexpr absl::Duration kReportWait = absl::Milliseconds(100);

  HostBootstrap(int rank, int world_size, std::vector<int> fds, absl::Duration timeout)
      : rank_(rank), world_size_(world_size), fds_(std::move(fds)), timeout_(timeout) {}

  // Starts exchange number `sequence_ + 1` of call `call`: the sticky error, the timeout's and
  // the call name's checks, the deadline.
  absl::StatusOr<absl::Time> BeginExchange(absl::string_view call);
  // Gathers `mine` from every rank as exchange `kind` of call `call` (AllGather, Barrier and
  // AllAgree); a peer that brings more than `max_each` bytes (at most kMaxMessageBytes) breaks
  // the bootstrap.
  absl::StatusOr<std::vector<std::string>> Gather(Exchange kind, absl::string_view call,
                                                  absl::string_view mine, uint64_t max_each);
  absl::Status SendFrame(int peer_index, Exchange kind, absl::string_view call,
                         absl::string_view bytes, absl::Time deadline);
  // Receives the frame of exchange `kind` of call `call` from the peer at `peer_index`: at most
  // `max_bytes`. On rank 0, a peer at another call name is first reported to every peer
  // (SendCallMismatch); on the others, rank 0's report is this call's error.
  absl::StatusOr<std::string> ReceiveFrame(int peer_index, Exchange kind, absl::string_view call,
                                           uint64_t max_bytes, absl::Time deadline);
  // On rank 0: tells every peer that rank `peer` made call `peer_call` where rank 0 made `call`,
  // an exchange of `kind`. Waits at most report_wait_ (and not past `deadline`) for room in the
  // connections that are full, all at once; a peer whose connection stays full gets no report,
  // or part of one, and sees the connection close.
  void SendCallMismatch(int peer, absl::string_view peer_call, Exchange kind,
                        absl::string_view call, absl::Time deadline);
  int PeerRank(int peer_index) const { return rank_ == 0 ? peer_index + 1 : 0; }
  absl::Status Fail(absl::Status status);

  int rank_;
  int world_size_;
  std::vector<int> fds_;
  absl::Duration timeout_;
  absl::Duration report_wait_ = kReportWait;  // SendCallMismatch's; only tests change it
  uint64_t sequence_ = 0;  // exchanges begun; the same on every rank that follows the protocol
  absl::Status broken_;    // first transport error; sticky
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_HOST_BOOTSTRAP_H_
