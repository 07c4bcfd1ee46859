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
expect_bad load_threads '--load_threads is 0; read with at least 1 thread' --load_threads=0
expect_bad gen_tokens '--prompt_len and --gen_tokens must be positive' --gen_tokens=0
expect_bad prompt_len '--prompt_len and --gen_tokens must be positive' --prompt_len=-3
expect_bad config_missing "$tmp/missing.textproto" "--config=$tmp/missing.textproto"
expect_bad logits_out_batches '--logits_out writes one sequence'"'"'s logits; give --batch=1 (not --batch=1,8)' \
  "--logits_out=$tmp/logits.bin" --batch=1,8

# Flags absl cannot parse, and arguments that are not flags: exit code 2 (not absl's 1).
expect_bad bad_int 'Bad value "abc" for --prompt_len' --prompt_len=abc
expect_bad bad_bool 'Bad value "maybe" for --capture_prefill' --capture_prefill=maybe
expect_bad unknown_flag 'Unknown flag --batches; run with --help' --batches=1
expect_bad flagfile_missing "Cannot open --flagfile \"$tmp/no_flags\": No such file or directory" \
  "--flagfile=$tmp/no_flags"
expect_bad flagfile_directory "Cannot read --flagfile \"$tmp\": Is a directory" "--flagfile=$tmp"
expect_bad missing_value 'Flag --batch needs a value' --batch
expect_bad positional 'Unexpected argument "llama"; generate takes only flags' llama
# Lists: empty, an empty entry, a number beyond int.
expect_bad batch_empty '--batch is empty; give the batch sizes to run' --batch=
expect_bad batch_empty_entry '--batch=1,,8 has an empty entry' --batch=1,,8
expect_bad batch_out_of_range '--batch has "99999999999", which is out of range' --batch=99999999999
expect_bad max_kv_blocks '--max_kv_blocks is -1; give a positive limit, or 0' --max_kv_blocks=-1
# What the planner and the Runner refuse, said before the GPU is looked for.
expect_bad max_num_seqs_zero 'max_num_seqs must be positive, got 0; set --max_num_seqs' \
  --max_num_seqs=0
expect_bad max_num_batched_tokens 'max_num_batched_tokens must be positive, got -1' \
  --max_num_batched_tokens=-1
expect_bad max_model_len 'max_model_len must be positive, got 0' --max_model_len=0
expect_bad utilization 'gpu_memory_utilization 1.5 is outside (0, 1]' --gpu_memory_utilization=1.5
expect_bad unknown_preset 'Unknown model preset "llama-9"' --preset=llama-9
expect_bad config_tp 'tensor_parallel_size 4 needs one process per GPU, and generate runs one' \
  --config=runtime/config/testdata/llama70b_tp4.textproto
expect_bad config_dir "Cannot read config file \"$tmp\": Is a directory" "--config=$tmp"
expect_bad prompt_ids_vocab 'has token 128256, outside the model'"'"'s vocabulary [0, 128256)' \
  --prompt_ids=1,128256
expect_bad too_long 'A prompt of 4000 tokens and 100 generated tokens exceed --max_model_len 4096' \
  --prompt_len=4000 --gen_tokens=100
expect_bad logits_out_dir "--logits_out \"$tmp/no/such/logits.bin\"'s directory does not exist" \
  "--logits_out=$tmp/no/such/logits.bin" --batch=1
# A --config file's limits hold where no flag sets them; a flag still wins.
printf 'max_num_seqs: 4\nmax_model_len: 64\n' >"$tmp/limits.textproto"
expect_bad config_max_num_seqs '--batch 8 is outside [1, --max_num_seqs 4]' \
  "--config=$tmp/limits.textproto" --batch=8
expect_bad config_max_model_len 'generated tokens exceed --max_model_len 64' \
  "--config=$tmp/limits.textproto" --batch=1
expect_bad flag_over_config '--batch 8 is outside [1, --max_num_seqs 6]' \
  "--config=$tmp/limits.textproto" --max_num_seqs=6 --batch=8
expect_bad prompt_len_and_ids '--prompt_len and --prompt_ids both set the prompt' \
  --prompt_len=3 --prompt_ids=1,2,3
expect_bad empty_int 'Flag --max_num_seqs is empty; give it a value or leave it out' \
  --max_num_seqs=
# --weights: a missing file or a directory is a bad flag; a truncated file is found (exit code 1)
# before the GPU is looked for.
expect_bad weights_missing "Cannot open safetensors file \"$tmp/missing.safetensors\"" \
  "--weights=$tmp/missing.safetensors"
expect_bad weights_dir "--weights \"$tmp\" is a directory; give its safetensors files" \
  "--weights=$tmp"
header='{"model.norm.weight":{"dtype":"BF16","shape":[2048],"data_offsets":[0,4096]}}'
{
  printf "$(printf '\\x%02x' ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
  printf '%s' "$header"
  head -c 100 /dev/zero
} >"$tmp/truncated.safetensors"
expect_exit weights_truncated 1 "\"$tmp/truncated.safetensors\" has only 100 bytes of data" \
  "--weights=$tmp/truncated.safetensors"
# --preset is layered over --config's model (the 1B preset's vocabulary takes token 100, a
# 64-token model's would not); the truncated weights then stop it.
printf '{"model": {"name": "tiny", "hidden_size": 64, "num_layers": 1, "num_heads": 1,
  "num_kv_heads": 1, "head_dim": 64, "intermediate_size": 64, "vocab_size": 64,
  "dtype": "DTYPE_BF16"}}' >"$tmp/tiny.json"
expect_exit preset_over_config 1 'has only 100 bytes of data' "--config=$tmp/tiny.json" \
  --preset=llama-3.2-1b --prompt_ids=100 --batch=1 "--weights=$tmp/truncated.safetensors"

# --model_dir: a Hugging Face model directory (config.json and its safetensors).
llama=runtime/config/testdata/Llama-3.2-1B  # Llama-3.2-1B's config.json, no weights
expect_bad model_dir_missing "Model directory \"$tmp/no_such_model\" does not exist" \
  "--model_dir=$tmp/no_such_model"
mkdir -p "$tmp/gemma"
printf '{"model_type": "gemma2", "hidden_size": 3584}' >"$tmp/gemma/config.json"
expect_bad model_dir_gemma 'model_type "gemma2" is not a Llama-family decoder kiln runs' \
  "--model_dir=$tmp/gemma"
expect_bad model_dir_no_weights 'holds no weights: no model.safetensors.index.json' \
  "--model_dir=$llama"
expect_bad model_dir_and_weights '--model_dir and --weights both name the weights' \
  "--model_dir=$llama" --weights=model.safetensors
expect_bad model_dir_and_preset '--model_dir and --preset both name the model' \
  "--model_dir=$llama" --preset=llama-3.2-1b
expect_bad model_dir_and_config '--model_dir and --config both set the model' \
  "--model_dir=$llama" --config=runtime/config/testdata/llama70b_tp4.textproto
mkdir -p "$tmp/fp16"
sed 's/"torch_dtype": "bfloat16"/"torch_dtype": "float16"/' "$llama/config.json" \
  >"$tmp/fp16/config.json"
: >"$tmp/fp16/model.safetensors"
# float16 weights load rounded to bf16: past the flag checks, saying so (the empty file or the
# missing GPU then stops it, exit code 1).
"$bin" "--model_dir=$tmp/fp16" --batch=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 1 ]; then
  fail "model_dir_fp16: exit code $rc, want 1 (past the flag checks); stderr: $(cat "$tmp/err")"
fi
if ! grep -q "1 safetensors file, fp16 weights rounded to bf16 as they load" "$tmp/out"; then
  fail "model_dir_fp16: stdout does not say the weights are rounded: $(cat "$tmp/out")"
fi
mkdir -p "$tmp/groups_of_9"  # 72 query heads over 8 KV heads
sed 's/"num_attention_heads": 32/"num_attention_heads": 72/' "$llama/config.json" \
  >"$tmp/groups_of_9/config.json"
: >"$tmp/groups_of_9/model.safetensors"
expect_bad model_dir_groups_of_9 \
  'Decode attention has no kernel for 72 query heads over 8 KV heads (9 per KV head)' \
  "--model_dir=$tmp/groups_of_9"

# Mistral 7B v0.1's sliding window: refused past it, accepted up to it.
mkdir -p "$tmp/mistral"
cat >"$tmp/mistral/config.json" <<'JSON'
{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
 "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
 "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000}
JSON
: >"$tmp/mistral/model.safetensors"
expect_bad model_dir_sliding_window \
  'attends over a sliding window of its last 4096 tokens, which kiln'"'"'s attention does not' \
  "--model_dir=$tmp/mistral" --max_model_len=8192
"$bin" "--model_dir=$tmp/mistral" --max_model_len=4096 --batch=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 1 ]; then
  fail "model_dir_mistral: exit code $rc, want 1 (past the flag checks); stderr: $(cat "$tmp/err")"
fi

# A good directory passes the flag checks and says what it found; the empty weight file (or the
# missing GPU) then stops it with a runtime error, exit code 1.
mkdir -p "$tmp/Llama-3.2-1B"
cp "$llama/config.json" "$tmp/Llama-3.2-1B/"
: >"$tmp/Llama-3.2-1B/model-00001-of-00002.safetensors"
: >"$tmp/Llama-3.2-1B/model-00002-of-00002.safetensors"
printf '{"weight_map": {"a": "%s", "b": "%s", "c": "%s"}}' model-00001-of-00002.safetensors \
  model-00002-of-00002.safetensors model-00001-of-00002.safetensors \
  >"$tmp/Llama-3.2-1B/model.safetensors.index.json"
"$bin" "--model_dir=$tmp/Llama-3.2-1B" --batch=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 1 ]; then
  fail "model_dir_found: exit code $rc, want 1; stderr: $(cat "$tmp/err")"
else
  expect_out model_dir_found "model_dir $tmp/Llama-3.2-1B: Llama-3.2-1B, 2 safetensors files"
fi

# Paths and values holding an ESC, a newline and U+009B are named escaped, on one clean line.
mkdir -p "$tmp/$odd"
expect_bad logits_out_odd_dir "--logits_out \"$tmp/$odd_escaped\" is a directory; give a file" \
  "--logits_out=$tmp/$odd" --batch=1
expect_clean logits_out_odd_dir
expect_bad logits_out_odd_missing \
  "--logits_out \"$tmp/$odd_escaped/no/logits.bin\"'s directory does not exist" \
  "--logits_out=$tmp/$odd/no/logits.bin" --batch=1
expect_clean logits_out_odd_missing
expect_bad logits_out_odd_unwritable "--logits_out \"/proc/$odd_escaped.bin\" cannot be written: " \
  "--logits_out=/proc/$odd.bin" --batch=1
expect_clean logits_out_odd_unwritable
expect_bad logits_out_odd_batches \
  'give --batch=1 (not --batch=1,\n2)' "--logits_out=$tmp/logits.bin" --batch=$'1,\n2'
expect_clean logits_out_odd_batches
# Only spaces and commas reach the empty entry: anything else is named as not an integer.
expect_bad batch_odd_empty_entry '--batch=,\n,\t has an empty entry' --batch=$',\n,\t'
expect_clean batch_odd_empty_entry
expect_bad batch_odd_entry "--batch has \"$odd_escaped\", which is not an integer" "--batch=1,$odd"
expect_clean batch_odd_entry
expect_bad graphs_odd "Unknown --graphs \"$odd_escaped\"; use full, piecewise or none" \
  "--graphs=$odd"
expect_clean graphs_odd
expect_bad weights_odd_dir "--weights \"$tmp/$odd_escaped\" is a directory" "--weights=$tmp/$odd"
expect_clean weights_odd_dir
mkfifo "$tmp/$odd/weights.fifo"
expect_bad weights_odd_fifo "--weights \"$tmp/$odd_escaped/weights.fifo\" is not a regular file" \
  "--weights=$tmp/$odd/weights.fifo"
expect_clean weights_odd_fifo
expect_bad weights_odd_commas '--weights=,\n, names no file' --weights=$',\n,'
expect_clean weights_odd_commas
expect_bad positional_odd "Unexpected argument \"$odd_escaped\"; generate takes only flags" \
  -- "$odd"
expect_clean positional_odd
cp runtime/config/testdata/llama70b_tp4.textproto "$tmp/$odd.textproto"
expect_bad model_dir_and_odd_config \
  "--model_dir and --config both set the model (\"$tmp/$odd_escaped.textproto\" sets model_preset" \
  "--model_dir=$llama" "--config=$tmp/$odd.textproto"
expect_clean model_dir_and_odd_config
mkdir -p "$tmp/$odd/gemma"
printf '{"model_type": "gemma2", "hidden_size": 3584}' >"$tmp/$odd/gemma/config.json"
expect_bad model_dir_odd_config \
  "\"$tmp/$odd_escaped/gemma/config.json\": model_type \"gemma2\" is not a Llama-family decoder" \
  "--model_dir=$tmp/$odd/gemma"
expect_clean model_dir_odd_config
# A good directory of an odd name: named escaped on stdout too, and before the weights' message.
mkdir -p "$tmp/$odd/$odd"
cp "$llama/config.json" "$tmp/$odd/$odd/"
: >"$tmp/$odd/$odd/model.safetensors"
"$bin" "--model_dir=$tmp/$odd/$odd" --batch=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 1 ]; then
  fail "model_dir_odd: exit code $rc, want 1; stderr: $(cat -v "$tmp/err")"
else
  expect_out model_dir_odd \
    "model_dir $tmp/$odd_escaped/$odd_escaped: $odd_escaped, 1 safetensors file"
  expect_clean model_dir_odd "$tmp/out"
  grep -qF -- "generate: --model_dir \"$tmp/$odd_escaped/$odd_escaped\": " "$tmp/err" ||
    fail "model_dir_odd: stderr does not name the directory escaped: $(cat -v "$tmp/err")"
fi

finish
