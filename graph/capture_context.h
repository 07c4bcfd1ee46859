// The thread-local capture phase and key that components read on every call.
//
//   // In a collective or an attention launcher, on every call (never cached):
//   switch (kiln::CaptureContext::Phase()) {
//     case kiln::CapturePhase::kCapture:        // recording: remember buffer addresses
//     case kiln::CapturePhase::kWarmup:         // eager, but a capture of this key follows
//     case kiln::CapturePhase::kReplayPrepare:  // host-side setup before a replay
//     case kiln::CapturePhase::kEager:          // plain eager call
//   }
//
//   // The owner of the capture (GraphSet) sets it for a scope:
//   {
//     kiln::CaptureContext::Scope scope(kiln::CapturePhase::kWarmup,
//                                       {kiln::GraphMode::kDecode, 8});
//     RETURN_IF_ERROR(step());
//   }
//
// Warm-up is its own phase, distinct from capture, so a component can never freeze a decision
// made during warm-up into the graph: it must ask again when the phase is kCapture.
// This target holds no CUDA-graph machinery and depends on nothing but the standard library,
// so collectives and attention depend on it cheaply. Thread-safe (state is per thread).
#ifndef KILN_GRAPH_CAPTURE_CONTEXT_H_
#define KILN_GRAPH_CAPTURE_CONTEXT_H_

#include <string>

namespace kiln {

// What the current thread is doing with respect to CUDA graphs.
//   kEager ──Scope(kWarmup)──► kWarmup ──Scope(kCapture)──► kCapture ──► kEager
//   kEager ──Scope(kReplayPrepare)──► kReplayPrepare (host work before a replay) ──► kEager
enum class CapturePhase {
  kEager,          // no graph involved
  kWarmup,         // an eager run made right before capturing the same key
  kCapture,        // the stream is being captured into a graph
  kReplayPrepare,  // preparing inputs of a graph that is about to be replayed
};

// The kind of step a graph serves.
enum class GraphMode {
  kDecode,   // one new token per sequence; size = padded number of sequences
  kPrefill,  // prefill-only; size = padded number of tokens
  kMixed,    // prefill and decode together; size = padded number of tokens
};

// Identifies one captured graph: its mode and padded size.
struct CaptureKey {
  GraphMode mode = GraphMode::kDecode;
  int size = 0;

  friend bool operator==(const CaptureKey& a, const CaptureKey& b) {
    return a.mode == b.mode && a.size == b.size;
  }
  friend bool operator!=(const CaptureKey& a, const CaptureKey& b) { return !(a == b); }
  friend bool operator<(const CaptureKey& a, const CaptureKey& b) {
    return a.mode != b.mode ? a.mode < b.mode : a.size < b.size;
  }
};

// Returns "eager", "warm-up", "capture" or "replay-prepare".
const char* PhaseName(CapturePhase phase);

// Returns "decode", "prefill" or "mixed".
const char* GraphModeName(GraphMode mode);

// Returns "decode/8".
std::string KeyName(const CaptureKey& key);

class CaptureContext {
 public:
  // Returns this thread's current phase (kEager unless a Scope is active).
  static CapturePhase Phase();

  // Returns the key of the active Scope ({kDecode, 0} when none is).
  static CaptureKey Key();

  // Returns true while this thread captures (Phase() == kCapture).
  static bool IsCapturing() { return Phase() == CapturePhase::kCapture; }

  // Sets this thread's phase and key for the Scope's lifetime and restores the previous ones on
  // destruction. Scopes nest (the innermost wins). Not movable or copyable.
  class Scope {
   public:
    Scope(CapturePhase phase, CaptureKey key);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CapturePhase previous_phase_;
    CaptureKey previous_key_;
  };
};

}  // namespace kiln

#endif  // KILN_GRAPH_CAPTURE_CONTEXT_H_
