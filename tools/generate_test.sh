#!/usr/bin/env bash
# Runs //tools:generate with every kind of bad flag: each must exit with code 2 and say on stderr
# what is wrong and how to fix it, before it looks for a GPU (so this runs on any machine).
set -uo pipefail

bin=tools/generate
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

expect_bad batch_zero '--batch 0 is outside [1, --max_num_seqs 256]' --batch=0
expect_bad batch_above '--batch 300 is outside [1, --max_num_seqs 256]' --batch=1,300
expect_bad batch_above_limit '--batch 9 is outside [1, --max_num_seqs 8]' --batch=9 \
  --max_num_seqs=8
expect_bad batch_text '--batch has "x", which is not an integer' --batch=1,x
expect_bad prompt_ids_text '--prompt_ids has "y", which is not an integer' --prompt_ids=1,y
expect_bad graphs 'Unknown --graphs "sometimes"; use full, piecewise or none' --graphs=sometimes
expect_bad gen_tokens '--prompt_len and --gen_tokens must be positive' --gen_tokens=0
expect_bad prompt_len '--prompt_len and --gen_tokens must be positive' --prompt_len=-3
expect_bad config_missing "$tmp/missing.textproto" "--config=$tmp/missing.textproto"

finish
