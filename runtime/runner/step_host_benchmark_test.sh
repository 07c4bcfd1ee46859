#!/usr/bin/env bash
# Runs //runtime/runner:step_host_benchmark for a few steps: it must print a line of numbers for
# each batch, routed to the batch's decode key, ending in a digest of its first timed step that
# the same seed repeats and another seed changes. Then with bad flags: each must exit non-zero and
# say on stderr what is wrong (code 2 for the values it checks, absl's 1 for a flag it lacks).
set -uo pipefail

bin=runtime/runner/step_host_benchmark
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

# A row: batch, key, median, p90, us/seq, six stages of "median share%", then the digest.
number='[0-9]+\.[0-9]+'
stage=" +$number +[0-9]+%"
row() {
  echo "^ +$1  decode/$2 +$number +$number +$number \|($stage){6} \| [0-9a-f]{16}\$"
}

if expect_ok small --batches=1,3,256 --steps=5 --warmup=2 --context=100; then
  for b in "1 1" "3 4" "256 256"; do
    set -- $b
    grep -Eq "$(row "$1" "$2")" "$tmp/out" || fail "small: no row for batch $1: $(cat "$tmp/out")"
  done
  rows=$(grep -Ec '^ +[0-9]+  decode/' "$tmp/out")
  [ "$rows" -eq 3 ] || fail "small: $rows rows, want 3: $(cat "$tmp/out")"
  expect_out small 'the Runner'"'"'s replay decision (whether the key has a captured graph) is left out'
  expect_out small 'Llama-3.2-1B (vocab 128256), max_num_seqs 256'
fi
# The shortest context: every sequence starts its windows at 1 token.
if expect_ok context_one --batches=2 --context=1 --steps=3 --warmup=0; then
  grep -Eq "$(row 2 2)" "$tmp/out" || fail "context_one: no row for batch 2: $(cat "$tmp/out")"
fi
# The same seed gives the same keys, setup lines and digests (timings differ): two runs print the
# same output once every decimal is masked and each row is cut to its batch, key and digest.
# Another seed draws other ids and tokens: every batch's digest changes.
untimed() {
  sed -E 's/[0-9]+\.[0-9]+/N/g; s/^( +[0-9]+  decode\/[0-9]+) .* \| ([0-9a-f]{16})$/\1 \2/' "$1"
}
# digests FILE: "batch digest" for each row of a run's output.
digests() {
  sed -nE 's/^ +([0-9]+)  decode\/[0-9]+ .* \| ([0-9a-f]{16})$/\1 \2/p' "$1"
}
if expect_ok seeded --batches=3,8 --steps=2 --seed=7; then
  grep -Eq "$(row 3 4)" "$tmp/out" || fail "seeded: no row for batch 3: $(cat "$tmp/out")"
  grep -Eq "$(row 8 8)" "$tmp/out" || fail "seeded: no row for batch 8: $(cat "$tmp/out")"
  expect_out seeded 'ids and tokens from seed 7'
  untimed "$tmp/out" >"$tmp/seeded_first"
  digests "$tmp/out" >"$tmp/digests_first"
  if expect_ok seeded_again --batches=3,8 --steps=2 --seed=7; then
    untimed "$tmp/out" >"$tmp/seeded_second"
    grep -Eq '^ +8  decode/8 [0-9a-f]{16}$' "$tmp/seeded_second" ||
      fail "seeded_again: no key and digest line for batch 8: $(cat "$tmp/seeded_second")"
    diff -u "$tmp/seeded_first" "$tmp/seeded_second" >"$tmp/seeded_diff" ||
      fail "seeded: key, setup or digest lines differ between runs with seed 7:" \
        "$(cat "$tmp/seeded_diff")"
  fi
  if expect_ok other_seed --batches=3,8 --steps=2 --seed=8; then
    digests "$tmp/out" >"$tmp/digests_other"
    [ "$(wc -l <"$tmp/digests_other")" -eq 2 ] ||
      fail "other_seed: $(wc -l <"$tmp/digests_other") digests, want 2: $(cat "$tmp/out")"
    # Both list batches 3 and 8 in flag order: each line pairs a batch's two digests.
    same=$(paste -d ' ' "$tmp/digests_first" "$tmp/digests_other" |
      awk '$2 == $4 { printf " %s", $1 }')
    [ -z "$same" ] ||
      fail "other_seed: seeds 7 and 8 give the same digest for batches$same: $(cat "$tmp/out")"
  fi
fi

expect_bad batch_zero '--batches: bad entry "0" (want integers in [1, 256])' --batches=0
expect_bad batch_above '--batches: bad entry "257" (want integers in [1, 256])' --batches=1,257
expect_bad batch_text '--batches: bad entry "x" (want integers in [1, 256])' --batches=8,x
expect_bad batches_empty '--batches is empty; give decode batch sizes' --batches=
expect_bad context_zero '--context=0 must lie in [1, --max_model_len - --block_size = 4032]' \
  --context=0
expect_bad context_long '--context=4090 must lie in [1, --max_model_len - --block_size = 4032]' \
  --context=4090
expect_bad context_long_model_len '--context=1024 must lie in [1, --max_model_len - --block_size = 960]' \
  --max_model_len=1024
expect_bad block_size '--block_size=0 must be positive' --block_size=0
expect_bad max_model_len '--max_model_len=-1 must be positive' --max_model_len=-1
expect_bad steps '--steps=0 must be at least 1' --steps=0
expect_bad warmup '--warmup=-1 must be at least 0' --warmup=-1
expect_bad preset '--preset=llama-9z, --gpu=h100-80gb: ' --preset=llama-9z
expect_bad gpu '--preset=llama-3.2-1b, --gpu=tpu: ' --gpu=tpu
expect_bad positional 'Unexpected argument "fast"; step_host_benchmark takes only flags' fast
expect_exit unknown_flag 1 "Unknown command line flag 'no_such_flag'" --no_such_flag=1
expect_exit bad_int 1 "Illegal value 'many' specified for flag 'steps'" --steps=many

finish
