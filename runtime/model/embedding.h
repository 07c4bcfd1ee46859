// Row gather: out[i, :] = table[indices[i], :]. It is the token embedding, and also picks the
// last token of each sequence out of the hidden states before the LM head.
//
//   // [num_tokens, hidden] <- embedding [vocab, hidden] at token ids [num_tokens]
//   CUDA_RETURN_IF_ERROR(kiln::LaunchEmbeddingGather(embedding, vocab, hidden, token_ids,
//                                                    num_tokens, hidden_states, stream));
//
// One block per output row, 16-byte accesses when `width` is a multiple of 8 and every pointer
// is 16-byte aligned (else one element at a time). The launch shape depends only on
// `num_rows` and `width`, never on the indices, so a captured graph replays correctly for any
// ids; an index outside [0, table_rows) (for instance a padding slot) yields a zero row instead
// of an out-of-bounds read. `clear`, when not null, is a [num_rows, clear_width] buffer whose
// rows the same blocks set to zero (a step's first kernel clears what the step must find zeroed,
// without a memset node of its own). Callable during capture; thread-safe.
#ifndef KILN_RUNTIME_MODEL_EMBEDDING_H_
#define KILN_RUNTIME_MODEL_EMBEDDING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln {

// Enqueues the gather on `stream`. Returns cudaErrorInvalidValue for a negative count, a
// non-positive width, a negative clear_width or (for num_rows > 0) a null table, indices or out,
// else the launch's error. num_rows == 0 launches nothing.
cudaError_t LaunchEmbeddingGather(const __nv_bfloat16* table,  // [table_rows, width]
                                  int64_t table_rows, int width,
                                  const int32_t* indices,      // [num_rows]
                                  int num_rows,
                                  __nv_bfloat16* out,          // [num_rows, width]
                                  cudaStream_t stream,
                                  __nv_bfloat16* clear = nullptr,  // [num_rows, clear_width]
                                  int clear_width = 0);

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_EMBEDDING_H_
