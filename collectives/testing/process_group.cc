#include "collectives/testing/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace kiln {
namespace testing {
namespace {

constexpr char kRankVar[] = "KILN_PG_RANK";
constexpr char kWorldVar[] = "KILN_PG_WORLD";
constexpr char kFdsVar[] = "KILN_PG_FDS";
constexpr char kReportVar[] = "KILN_PG_REPORT_FD";

int report_fd = -1;  // this child's end of the report pipe

absl::Status ErrnoStatus(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", std::strerror(errno)));
}

void CloseIfOpen(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Splits a buffer of [uint32 length][bytes] frames into records.
std::vector<std::string> ParseRecords(const std::string& buffer) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos + sizeof(uint32_t) <= buffer.size()) {
    uint32_t size = 0;
    std::memcpy(&size, buffer.data() + pos, sizeof(size));
    if (pos + sizeof(size) + size > buffer.size()) break;
    records.push_back(buffer.substr(pos + sizeof(size), size));
    pos += sizeof(size) + size;
  }
  return records;
}

}  // namespace

bool IsProcessGroupChild() { return std::getenv(kRankVar) != nullptr; }

void ReportRecord(absl::string_view record) {
  if (report_fd < 0) return;
  std::string frame;
  const uint32_t size = static_cast<uint32_t>(record.size());
  frame.append(reinterpret_cast<const char*>(&size), sizeof(size));
  frame.append(record.data(), record.size());
  const char* p = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    ssize_t n = write(report_fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

absl::StatusOr<ProcessGroupMember> JoinProcessGroup(absl::Duration bootstrap_timeout) {
  const char* rank_s = std::getenv(kRankVar);
  const char* world_s = std::getenv(kWorldVar);
  const char* fds_s = std::getenv(kFdsVar);
  const char* report_s = std::getenv(kReportVar);
  if (rank_s == nullptr || world_s == nullptr || fds_s == nullptr || report_s == nullptr) {
    return absl::FailedPreconditionError(
        "JoinProcessGroup() outside a process started by RunProcessGroup (no KILN_PG_* "
        "variables)");
  }
  ProcessGroupMember member;
  std::vector<int> fds;
  if (!absl::SimpleAtoi(rank_s, &member.rank) || !absl::SimpleAtoi(world_s, &member.world_size) ||
      !absl::SimpleAtoi(report_s, &report_fd)) {
    return absl::InvalidArgumentError("Malformed KILN_PG_* variables");
  }
  for (absl::string_view part : absl::StrSplit(fds_s, ',', absl::SkipEmpty())) {
    int fd = -1;
    if (!absl::SimpleAtoi(part, &fd)) return absl::InvalidArgumentError("Malformed KILN_PG_FDS");
    fds.push_back(fd);
  }
  absl::StatusOr<std::unique_ptr<HostBootstrap>> bootstrap = HostBootstrap::FromConnectedSockets(
      member.rank, member.world_size, std::move(fds), bootstrap_timeout);
  if (!bootstrap.ok()) return bootstrap.status();
  member.bootstrap = std::move(bootstrap).value();
  return member;
}

std::string ReadFileTail(const std::string& path, size_t max_bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "";
  std::stringstream ss;
  ss << file.rdbuf();
  std::string all = ss.str();
  if (all.size() > max_bytes) all = "...\n" + all.substr(all.size() - max_bytes);
  return all;
}

std::string DescribeOutcome(const RankOutcome& o) {
  if (o.killed_after_timeout) {
    return absl::StrFormat("rank %d did not finish in time and was killed", o.rank);
  }
  if (o.exited) return absl::StrFormat("rank %d exited with code %d", o.rank, o.exit_code);
  return absl::StrFormat("rank %d was ended by signal %d (%s)", o.rank, o.signal,
                         strsignal(o.signal));
}

absl::StatusOr<std::vector<RankOutcome>> RunProcessGroup(const ProcessGroupOptions& options) {
  const int world = options.world_size;
  if (world < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Process group world size %d must be at least 1", world));
  }
  char exe[4096] = {};
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return ErrnoStatus("readlink(/proc/self/exe)");
  std::string log_dir = options.log_dir;
  if (log_dir.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    log_dir = tmp != nullptr ? tmp : "/tmp";
  }
  static std::atomic<int> group_counter{0};
  const int group = group_counter++;

  // Descriptors: bootstrap sockets (rank 0 <-> rank i), report pipes, logs. All close-on-exec;
  // each child clears the flag on its own ones.
  std::vector<std::vector<int>> child_fds(world);
  std::vector<int> report_read(world, -1), report_write(world, -1), log_fd(world, -1);
  std::vector<RankOutcome> outcomes(world);
  auto close_all = [&]() {
    for (auto& v : child_fds) {
      for (int& fd : v) CloseIfOpen(fd);
    }
    for (int r = 0; r < world; ++r) {
      CloseIfOpen(report_write[r]);
      CloseIfOpen(log_fd[r]);
    }
  };
  absl::Status setup = [&]() -> absl::Status {
    for (int i = 1; i < world; ++i) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        return ErrnoStatus("socketpair");
      }
      child_fds[0].push_back(sv[0]);
      child_fds[i].push_back(sv[1]);
    }
    for (int r = 0; r < world; ++r) {
      int p[2];
      if (pipe2(p, O_CLOEXEC) < 0) return ErrnoStatus("pipe2");
      report_read[r] = p[0];
      report_write[r] = p[1];
      fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
      outcomes[r].rank = r;
      if (r != options.passthrough_rank) {
        outcomes[r].log_path =
            absl::StrFormat("%s/kiln_pg_%d_%d_rank%d.log", log_dir, getpid(), group, r);
        log_fd[r] = open(outcomes[r].log_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC,
                         0644);
        if (log_fd[r] < 0) return ErrnoStatus(absl::StrCat("open ", outcomes[r].log_path));
      }
    }
    return absl::OkStatus();
  }();
  if (!setup.ok()) {
    close_all();
    for (int& fd : report_read) CloseIfOpen(fd);
    return setup;
  }

  // Everything the children need is built before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<std::vector<std::string>> envs(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> overrides = {
        absl::StrCat(kRankVar, "=", r),
        absl::StrCat(kWorldVar, "=", world),
        absl::StrCat(kFdsVar, "=", absl::StrJoin(child_fds[r], ",")),
        absl::StrCat(kReportVar, "=", report_write[r]),
        "NCCL_NVLS_ENABLE=0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "NVSHMEM_DISABLE_NVLS=1",
    };
    for (const auto& [k, v] : options.env) overrides.push_back(absl::StrCat(k, "=", v));
    auto overridden = [&](absl::string_view entry) {
      const absl::string_view name = entry.substr(0, entry.find('='));
      if (absl::StartsWith(name, "KILN_PG_")) return true;
      for (const std::string& o : overrides) {
        if (absl::string_view(o).substr(0, o.find('=')) == name) return true;
      }
      return false;
    };
    for (char** e = environ; *e != nullptr; ++e) {
      if (!overridden(*e)) envs[r].push_back(*e);
    }
    for (std::string& o : overrides) envs[r].push_back(std::move(o));
  }
  std::vector<std::string> args = options.argv;
  if (args.empty()) args.push_back(exe);
  args[0] = exe;
  std::vector<char*> argv_ptrs;
  for (std::string& a : args) argv_ptrs.push_back(a.data());
  argv_ptrs.push_back(nullptr);
  std::vector<std::vector<char*>> env_ptrs(world);
  for (int r = 0; r < world; ++r) {
    for (std::string& e : envs[r]) env_ptrs[r].push_back(e.data());
    env_ptrs[r].push_back(nullptr);
  }

  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      absl::Status s = ErrnoStatus("fork");
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[q], nullptr, 0);
      close_all();
      for (int& fd : report_read) CloseIfOpen(fd);
      return s;
    }
    if (pid == 0) {
      if (log_fd[r] >= 0) {
        dup2(log_fd[r], STDOUT_FILENO);
        dup2(log_fd[r], STDERR_FILENO);
      }
      for (int fd : child_fds[r]) fcntl(fd, F_SETFD, 0);
      fcntl(report_write[r], F_SETFD, 0);
      execve(exe, argv_ptrs.data(), env_ptrs[r].data());
      _exit(127);
    }
    pids[r] = pid;
  }
  // The parent takes no part: closing its copies lets a child see EOF when a peer dies.
  close_all();

  std::vector<std::string> buffers(world);
  auto drain = [&](int r) {
    char chunk[65536];
    while (report_read[r] >= 0) {
      ssize_t n = read(report_read[r], chunk, sizeof(chunk));
      if (n > 0) {
        buffers[r].append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // nothing more for now
      CloseIfOpen(report_read[r]);  // EOF or an error
      break;
    }
  };
  const absl::Time deadline = absl::Now() + options.timeout;
  int running = world;
  while (running > 0) {
    std::vector<pollfd> polls;
    for (int r = 0; r < world; ++r) {
      if (report_read[r] >= 0) polls.push_back({report_read[r], POLLIN, 0});
    }
    if (!polls.empty()) {
      poll(polls.data(), polls.size(), 20);
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
    for (int r = 0; r < world; ++r) drain(r);
    for (int r = 0; r < world; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        outcomes[r].exited = WIFEXITED(status);
        outcomes[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        outcomes[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        pids[r] = -1;
        --running;
      }
    }
    if (running > 0 && absl::Now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] < 0) continue;
        kill(pids[r], SIGKILL);
        int status = 0;
        waitpid(pids[r], &status, 0);
        outcomes[r].killed_after_timeout = true;
        outcomes[r].signal = SIGKILL;
        pids[r] = -1;
        --running;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    // Children are gone; read what is left (EOF ends it).
    if (report_read[r] >= 0) {
      fcntl(report_read[r], F_SETFL, fcntl(report_read[r], F_GETFL) & ~O_NONBLOCK);
      while (report_read[r] >= 0) drain(r);
    }
    outcomes[r].records = ParseRecords(buffers[r]);
  }
  return outcomes;
}

}  // namespace testing
}  // namespace kiln
