#include "runtime/cuda/kernel_trace.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/status.h"

namespace kiln {
namespace {

// CUPTI hands records to plain callbacks: they land here while a trace is active.
std::mutex g_mu;
bool g_active = false;
std::vector<KernelRecord>* g_records = nullptr;

constexpr size_t kBufferBytes = size_t{8} << 20;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return out;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || g_records == nullptr) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records->push_back({k->start, k->end, k->graphId, k->graphNodeId, Demangle(k->name)});
  }
  std::free(buffer);
}

absl::Status CuptiStatus(CUptiResult result, absl::string_view what) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  return absl::FailedPreconditionError(
      absl::StrCat(what, " failed: ", message != nullptr ? message : "unknown CUPTI error",
                   " (kernel tracing needs CUPTI from the CUDA toolkit and a GPU; no other "
                   "profiler may hold the process)"));
}

bool IsIdentifierChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Drops every namespace or class qualifier ("kiln::", "attention_internal::") from `s`.
std::string StripQualifiers(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (IsIdentifierChar(s[i])) {
      size_t j = i;
      while (j < s.size() && IsIdentifierChar(s[j])) ++j;
      if (s.substr(j, 2) != "::") out.append(s.substr(i, j - i));
      i = s.substr(j, 2) == "::" ? j + 2 : j;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

}  // namespace

std::string ShortKernelName(std::string_view demangled) {
  std::string s(demangled);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) {
    s.erase(at, sizeof("(anonymous namespace)::") - 1);
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // The parameter list starts at the first '(' outside the template arguments.
  int depth = 0;
  size_t end = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string out = StripQualifiers(std::string_view(s).substr(0, end));
  if (out.size() > 80) {
    // Cut at a character's first byte, not inside a UTF-8 sequence (a name is mostly ASCII, but
    // a template argument may be a string).
    size_t cut = 80;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xc0) == 0x80) --cut;
    out.resize(cut);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_active) {
      return absl::FailedPreconditionError(
          "KernelTrace::Start: a trace is already recording in this process; Finish it first");
    }
    g_active = true;
    g_records = new std::vector<KernelRecord>();
  }
  std::unique_ptr<KernelTrace> trace(new KernelTrace());
  absl::Status status =
      CuptiStatus(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
                  "cuptiActivityRegisterCallbacks");
  if (status.ok()) {
    status = CuptiStatus(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
                         "cuptiActivityEnable(CONCURRENT_KERNEL)");
  }
  if (!status.ok()) return status;  // the destructor releases the slot
  return trace;
}

KernelTrace::~KernelTrace() {
  if (!finished_) (void)Finish();
}

absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError("KernelTrace::Finish: called twice");
  }
  finished_ = true;
  const absl::Status synced = ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuptiActivityFlushAll(1);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::unique_ptr<std::vector<KernelRecord>> records;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    records.reset(g_records);
    g_records = nullptr;
    g_active = false;
  }
  if (!synced.ok()) return synced;
  std::sort(records->begin(), records->end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return std::move(*records);
}

absl::StatusOr<ReplayProfile> ProfileReplays(std::vector<KernelRecord> records) {
  std::map<uint32_t, int> per_graph;
  for (const KernelRecord& r : records) {
    if (r.graph_id != 0) ++per_graph[r.graph_id];
  }
  if (per_graph.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ProfileReplays: none of the ", records.size(),
                     " kernel records comes from a graph; trace while replaying a CUDA graph"));
  }
  const uint32_t graph =
      std::max_element(per_graph.begin(), per_graph.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      })->first;
  std::vector<KernelRecord> kernels;
  for (KernelRecord& r : records) {
    if (r.graph_id != graph) continue;
    // A span is a difference of unsigned timestamps: a record that ends before it starts would
    // wrap it into centuries.
    if (r.end_ns < r.start_ns) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ProfileReplays: kernel ", ShortKernelName(r.name), " (node ", r.graph_node,
          " of graph ", graph, ") ends at ", r.end_ns, " ns, before its start at ", r.start_ns,
          " ns; pass CUPTI's records as they came"));
    }
    kernels.push_back(std::move(r));
  }
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  // Replays: a node seen again starts the next one.
  std::vector<std::pair<size_t, size_t>> replays;  // [begin, end) into kernels
  std::set<uint64_t> seen;
  size_t begin = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!seen.insert(kernels[i].graph_node).second) {
      replays.push_back({begin, i});
      begin = i;
      seen = {kernels[i].graph_node};
    }
  }
  replays.push_back({begin, kernels.size()});
  const size_t per_replay = replays.front().second - replays.front().first;
  for (size_t r = 0; r < replays.size(); ++r) {
    const size_t n = replays[r].second - replays[r].first;
    if (n != per_replay) {
      return absl::InvalidArgumentError(
          absl::StrCat("ProfileReplays: replay ", r, " of graph ", graph, " has ", n,
                       " kernels, replay 0 ", per_replay,
                       "; the records must hold whole replays (trace from before a replay "
                       "starts until after one ends)"));
    }
  }
  // Each replay's span (first start to last end), then the replay of the median span.
  std::vector<std::pair<uint64_t, size_t>> spans;  // (span, replay)
  for (size_t r = 0; r < replays.size(); ++r) {
    uint64_t last = 0;
    for (size_t i = replays[r].first; i < replays[r].second; ++i) {
      last = std::max(last, kernels[i].end_ns);
    }
    spans.push_back({last - kernels[replays[r].first].start_ns, r});
  }
  std::sort(spans.begin(), spans.end());
  const std::pair<uint64_t, size_t> median_span = spans[spans.size() / 2];
  const std::pair<size_t, size_t> median = replays[median_span.second];

  ReplayProfile profile;
  profile.replays = static_cast<int>(replays.size());
  profile.kernels = static_cast<int>(per_replay);
  profile.span_us = static_cast<double>(median_span.first) / 1e3;
  std::map<std::string, KernelShare> shares;
  uint64_t latest = kernels[median.first].start_ns;
  for (size_t i = median.first; i < median.second; ++i) {
    const KernelRecord& k = kernels[i];
    const uint64_t increment = k.end_ns > latest ? k.end_ns - latest : 0;
    latest = std::max(latest, k.end_ns);
    const std::string name = ShortKernelName(k.name);
    KernelShare& share = shares[name];
    share.launches += 1;
    share.us += static_cast<double>(increment) / 1e3;
    profile.nodes.push_back({name, static_cast<double>(increment) / 1e3});
  }
  for (auto& [name, share] : shares) {
    share.kernel = name;
    profile.shares.push_back(share);
  }
  std::sort(profile.shares.begin(), profile.shares.end(),
            [](const KernelShare& a, const KernelShare& b) { return a.us > b.us; });
  return profile;
}

std::optional<RepeatedBlock> FindRepeatedBlock(const std::vector<NodeShare>& nodes,
                                               int min_repeats) {
  const int n = static_cast<int>(nodes.size());
  min_repeats = std::max(min_repeats, 2);
  int best_period = 0, best_first = 0, best_repeats = 0;
  for (int period = 1; period <= n / min_repeats; ++period) {  // period * min_repeats <= n
    // Runs of i where node i and node i + period run the same kernel: a run of length r from a
    // holds floor((r + period) / period) whole blocks starting at a.
    int run = 0;
    for (int i = 0; i + period <= n; ++i) {
      const bool same = i + period < n && nodes[i].kernel == nodes[i + period].kernel;
      if (same) {
        ++run;
        continue;
      }
      const int repeats = (run + period) / period;
      if (repeats >= min_repeats && repeats * period > best_repeats * best_period) {
        best_period = period;
        best_first = i - run;
        best_repeats = repeats;
      }
      run = 0;
    }
  }
  if (best_repeats == 0) return std::nullopt;
  RepeatedBlock block;
  block.first = best_first;
  block.repeats = best_repeats;
  for (int j = 0; j < best_period; ++j) {
    std::vector<double> us;
    for (int r = 0; r < best_repeats; ++r) us.push_back(nodes[best_first + r * best_period + j].us);
    std::sort(us.begin(), us.end());
    block.nodes.push_back({nodes[best_first + j].kernel, us[us.size() / 2]});
  }
  return block;
}

}  // namespace kiln
