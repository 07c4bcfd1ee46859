#include "graph/capture_context.h"

namespace kiln {
namespace {

thread_local CapturePhase current_phase = CapturePhase::kEager;
thread_local CaptureKey current_key;

}  // namespace

const char* PhaseName(CapturePhase phase) {
  switch (phase) {
    case CapturePhase::kEager:
      return "eager";
    case CapturePhase::kWarmup:
      return "warm-up";
    case CapturePhase::kCapture:
      return "capture";
    case CapturePhase::kReplayPrepare:
      return "replay-prepare";
  }
  return "unknown";
}

const char* GraphModeName(GraphMode mode) {
  switch (mode) {
    case GraphMode::kDecode:
      return "decode";
    case GraphMode::kPrefill:
      return "prefill";
    case GraphMode::kMixed:
      return "mixed";
  }
  return "unknown";
}

std::string KeyName(const CaptureKey& key) {
  return std::string(GraphModeName(key.mode)) + "/" + std::to_string(key.size);
}

CapturePhase CaptureContext::Phase() { return current_phase; }

CaptureKey CaptureContext::Key() { return current_key; }

CaptureContext::Scope::Scope(CapturePhase phase, CaptureKey key)
    : previous_phase_(current_phase), previous_key_(current_key) {
  current_phase = phase;
  current_key = key;
}

CaptureContext::Scope::~Scope() {
  current_phase = previous_phase_;
  current_key = previous_key_;
}

}  // namespace kiln
