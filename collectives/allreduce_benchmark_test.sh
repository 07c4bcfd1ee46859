#!/usr/bin/env bash
# Runs //collectives:allreduce_benchmark with bad flags: each must exit with code 2 and say on
# stderr what is wrong before any rank starts (so this runs on any machine, GPUs or not). Before
# these checks, --min_bytes=0 and --ops_per_graph=0 crashed the ranks with a division by zero and
# sizes out of order printed an empty table with exit code 0.
set -uo pipefail

bin=collectives/allreduce_benchmark
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

expect_bad min_bytes_zero '--min_bytes=0 must be a positive multiple of the 2-byte bf16 element' \
  --min_bytes=0
expect_bad min_bytes_negative '--min_bytes=-4096 must be a positive multiple' --min_bytes=-4096
expect_bad min_bytes_odd '--min_bytes=4098 must be a positive multiple of the 4-byte fp32 element' \
  --min_bytes=4098 --dtype=fp32
expect_bad sizes_out_of_order '--max_bytes=4096 is less than --min_bytes=8192' \
  --min_bytes=8192 --max_bytes=4096
expect_bad ops_per_graph_zero '--ops_per_graph=0 must be in 1..400' --ops_per_graph=0
expect_bad ops_per_graph_above '--ops_per_graph=401 must be in 1..400' --ops_per_graph=401
expect_bad samples_zero '--samples=0 must be at least 1' --samples=0
expect_bad world_size_negative '--world_size=-2 must be 0' --world_size=-2
expect_bad timeout_zero '--timeout_s=0 must be at least 1' --timeout_s=0
expect_bad dtype '--dtype=int8 is not one of bf16, fp16, fp32' --dtype=int8
expect_bad modes "--modes has unknown mode 'replay'" --modes=eager,replay
expect_bad modes_empty "--modes has unknown mode ''" --modes=
expect_bad algos "--algos has unknown 'three-shot'" --algos=auto,three-shot
expect_bad config_text "--config='max_blocks: many' is not an AllReduceConfig text proto" \
  '--config=max_blocks: many'
expect_bad config_range 'AllReduceConfig.max_blocks 0 must be in 1..128' '--config=max_blocks: 0'

finish
