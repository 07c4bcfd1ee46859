// Testing: host stand-ins for a step's device views that CheckLlamaStepArgs accepts (every view
// set, the activation region 256-byte aligned), for tests of refusals that come before anything
// reads a view. No kernel may run with them.
//
//   kiln::testing_internal::StepArgsStandIns s;
//   kiln::LlamaStepArgs args = s.Args(/*num_tokens=*/1, /*num_rows=*/1);
//   args.logits = nullptr;   // then expect the refusal
#ifndef KILN_RUNTIME_MODEL_INTERNAL_STEP_ARGS_STAND_INS_H_
#define KILN_RUNTIME_MODEL_INTERNAL_STEP_ARGS_STAND_INS_H_

#include <cstdint>

#include "runtime/model/llama_model.h"

namespace kiln {
namespace testing_internal {

struct StepArgsStandIns {
  alignas(256) char region[512] = {};
  int32_t ints[4] = {};
  float logits[4] = {};

  // A decode step of `num_tokens` tokens and `num_rows` rows over the stand-ins.
  LlamaStepArgs Args(int num_tokens, int num_rows) {
    LlamaStepArgs args;
    args.num_tokens = num_tokens;
    args.num_rows = num_rows;
    args.token_ids = ints;
    args.positions = ints;
    args.last_token_rows = ints;
    args.block_table = ints;
    args.max_blocks_per_seq = 1;
    args.decode.work_capacity = 1;
    args.activations = region;
    args.logits = logits;
    args.next_tokens = ints;
    return args;
  }
};

}  // namespace testing_internal
}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_INTERNAL_STEP_ARGS_STAND_INS_H_
