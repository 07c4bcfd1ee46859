#!/usr/bin/env bash
# Runs //tools:memory_planner as a user would: the default table against its golden file, the
# other output formats, config files, and every bad input (exit code 2, a message with the fix
# on stderr, nothing on stdout).
set -uo pipefail

bin=tools/memory_planner
data=runtime/config/testdata
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

# The default table, byte for byte.
if expect_ok default; then
  if ! diff -u tools/testdata/memory_planner_default.txt "$tmp/out" >"$tmp/diff"; then
    fail "default table differs from tools/testdata/memory_planner_default.txt:"
    cat "$tmp/diff" >&2
  fi
fi

# Output formats.
expect_ok json --format=json && expect_out json '"num_kv_blocks": "6969"' &&
  expect_out json '"name": "graph_pool"' && expect_out json '"max_concurrency": "54"'
expect_ok textproto --format=textproto && expect_out textproto 'num_kv_blocks: 6969' &&
  expect_out textproto 'model_preset: "llama-3.1-8b"'
expect_ok context --context=1024 &&
  expect_out context \
    'Max concurrency at 1,024 tokens per sequence: 256 sequences (max_num_seqs is the limit'
if expect_ok svg "--svg=$tmp/plan.svg"; then
  head -c 4 "$tmp/plan.svg" | grep -qF '<svg' || fail "svg: $tmp/plan.svg does not start with <svg"
  grep -qF 'kv_cache' "$tmp/plan.svg" || fail "svg: no kv_cache segment"
  tail -n 1 "$tmp/plan.svg" | grep -qF '</svg>' || fail "svg: not closed"
fi

# Config files and presets.
expect_ok textproto_config "--config=$data/llama70b_tp4.textproto" &&
  expect_out textproto_config 'Llama-3.1-70B (bf16) on NVIDIA H200, tensor_parallel_size 4' &&
  expect_out textproto_config \
    '8 decode graphs, sizes 1..128 + 14 prefill graphs, sizes 16..512 tokens'
expect_ok fastdeploy_config "--config=$data/fastdeploy.json" &&
  expect_out fastdeploy_config '9 decode graphs, sizes 1..128'
expect_ok json_config "--config=$data/custom_model.json" &&
  expect_out json_config 'tiny (fp16) on test GPU'
expect_ok flags_override_config "--config=$data/llama70b_tp4.textproto" --tensor_parallel_size=8 &&
  expect_out flags_override_config 'tensor_parallel_size 8'
expect_ok preset --preset=qwen2.5-7b --gpu=l40s &&
  expect_out preset 'Qwen2.5-7B (bf16) on NVIDIA L40S'
expect_ok preset_qwen3 --preset=qwen3-4b --gpu=h100 &&
  expect_out preset_qwen3 'QKV + QK norms, O, gate-up, down, norms'
# A Hugging Face model directory (Llama-3.2-1B's config.json alone, no weights) plans exactly as
# the preset of the same model.
if expect_ok preset_1b --preset=llama-3.2-1b; then
  mv "$tmp/out" "$tmp/preset_1b.txt"
  if expect_ok model_dir "--model_dir=$data/Llama-3.2-1B" &&
    ! diff -u "$tmp/preset_1b.txt" "$tmp/out" >"$tmp/diff"; then
    fail "model_dir: the plan differs from --preset=llama-3.2-1b's:"
    cat "$tmp/diff" >&2
  fi
fi
expect_ok model_dir_override "--model_dir=$data/Llama-3.2-1B" --gpu=l40s &&
  expect_out model_dir_override 'Llama-3.2-1B (bf16) on NVIDIA L40S'
# A float32 checkpoint's directory plans the bf16 weights the runner holds, and says so; --dtype
# plans them as stored.
mkdir -p "$tmp/Llama-fp32"
sed 's/"torch_dtype": "bfloat16"/"torch_dtype": "float32"/' "$data/Llama-3.2-1B/config.json" \
  >"$tmp/Llama-fp32/config.json"
if expect_ok model_dir_fp32 "--model_dir=$tmp/Llama-fp32"; then
  expect_out model_dir_fp32 'Llama-fp32 (bf16) on NVIDIA H100 80GB HBM3'
  grep -qF "holds fp32 weights, which kiln rounds to bf16 as it loads them" "$tmp/err" ||
    fail "model_dir_fp32: stderr does not say the weights are planned as bf16: $(cat "$tmp/err")"
fi
expect_ok model_dir_fp32_as_stored "--model_dir=$tmp/Llama-fp32" --dtype=fp32 &&
  expect_out model_dir_fp32_as_stored 'Llama-fp32 (fp32) on NVIDIA H100 80GB HBM3'
expect_ok no_graphs --graph_mode=none && expect_out no_graphs 'no CUDA graphs'
expect_ok capture_sizes --capture_sizes=1,2,4,8 &&
  expect_out capture_sizes '4 decode graphs, sizes 1..8 +'
if expect_ok no_prefill_graphs --capture_prefill=false; then
  line='Steps: max_num_seqs 256, max_num_batched_tokens 8,192; 27 decode graphs, sizes 1..256'
  grep -qxF "$line" "$tmp/out" ||
    fail "no_prefill_graphs: prefill graphs are still counted: $(cat "$tmp/out")"
  expect_out no_prefill_graphs 'largest of 27 graphs: decode/256 (256 tokens, 256 rows)'
fi
expect_ok prefill_sizes --prefill_sizes=64,512 &&
  expect_out prefill_sizes '27 decode graphs, sizes 1..256 + 2 prefill graphs, sizes 64..512 tokens'
expect_ok piecewise --graph_execution=piecewise &&
  expect_out piecewise 'piecewise, 33 graphs per size' &&
  expect_out piecewise 'none: piecewise graphs keep their activations in the eager arena' &&
  expect_out piecewise '1353 graphs x 128.0 KiB'
expect_ok max_model_len --max_model_len=131072 && expect_out max_model_len 'step metadata'
expect_ok prefill_only --graph_mode=prefill_only &&
  expect_out prefill_only '14 prefill-only graphs, sizes 16..512 tokens'

# Bad input: exit code 2 and a message that names the value and the fix.
expect_bad utilization_zero 'gpu_memory_utilization 0 is outside (0, 1]' --gpu_memory_utilization=0
expect_bad utilization_high 'gpu_memory_utilization 1.5 is outside (0, 1]; give the fraction' \
  --gpu_memory_utilization=1.5
expect_bad zero_layers 'model.num_layers must be positive, got 0; set it (--num_layers)' \
  --num_layers=0
expect_bad unknown_preset 'Unknown model preset "llama-9"; use one of llama-3.2-1b' --preset=llama-9
expect_bad unknown_gpu 'Unknown GPU preset "v100"; use one of h100-80gb' --gpu=v100
printf 'max_num_seqs: 8\nmodel { num_layer: 3 }\n' >"$tmp/bad.textproto"
# The parser's own quotes stay as they are.
message="Cannot parse $tmp/bad.textproto as a kiln.config.PlannerConfig textproto at line 2 \
column 18: Message type \"kiln.config.ModelShape\" has no field named \"num_layer\"; fix the file"
expect_bad bad_textproto "$message" "--config=$tmp/bad.textproto"
# A C1 control (U+009B, a terminal's CSI) in the path is written as its code point, never raw.
cp "$tmp/bad.textproto" "$tmp/csi$(printf '\302\233')2J.textproto"
expect_bad c1_in_path "Cannot parse $tmp/csi\\u009b2J.textproto as a kiln.config.PlannerConfig" \
  "--config=$tmp/csi$(printf '\302\233')2J.textproto"
LC_ALL=C grep -q "$(printf '\302\233')" "$tmp/err" && fail "c1_in_path: a raw CSI on stderr"
printf '{"max_num_seqs": 8,,}' >"$tmp/bad.json"
expect_bad bad_json "Cannot parse $tmp/bad.json as a JSON object" "--config=$tmp/bad.json"
printf '{"max_seq_len_to_capture": 8192}' >"$tmp/unknown.json"
expect_bad unknown_json_field 'max_seq_len_to_capture' "--config=$tmp/unknown.json"
expect_bad missing_config 'Cannot open config file' "--config=$tmp/no_such_file.textproto"
expect_bad model_dir_missing "Model directory \"$tmp/no_such_model\" does not exist" \
  "--model_dir=$tmp/no_such_model"
expect_bad model_dir_and_preset '--model_dir and --preset both name the model; keep one' \
  "--model_dir=$data/Llama-3.2-1B" --preset=llama-3.1-8b
expect_bad no_kv_block 'The budget leaves no room for a KV block' --preset=llama-3.1-70b
expect_bad no_kv_block_fix 'raise tensor_parallel_size' --preset=llama-3.1-70b
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_bad measure 'no CUDA device is visible on this machine; run without --measure' --measure
fi
expect_bad unknown_flag 'Unknown flag --utilization; run with --help' --utilization=0.9
expect_bad flagfile_missing "Cannot open --flagfile \"$tmp/no_flags\": No such file or directory" \
  --flagfile "$tmp/no_flags"
expect_bad flagfile_directory "Cannot read --flagfile \"$tmp\": Is a directory" --flagfile "$tmp"
# A readable flagfile is read, and its values checked as the flags' are.
printf -- '--max_num_seqs=0\n' >"$tmp/flags"
expect_bad flagfile_read 'max_num_seqs must be positive, got 0' "--flagfile=$tmp/flags"
expect_bad bad_number 'Bad value "lots" for --max_num_seqs' --max_num_seqs=lots
expect_bad bad_bool 'Bad value "maybe" for --tie_embeddings' --tie_embeddings=maybe
expect_bad missing_value 'Flag --preset needs a value' --preset
expect_bad positional 'Unexpected argument "llama"' llama
expect_bad format 'Unknown --format "xml"; use table, json or textproto' --format=xml
expect_bad context_zero '--context 0 must be positive' --context=0
expect_bad capture_not_int '--capture_sizes has "x", which is not an integer' --capture_sizes=1,x
expect_bad prefill_not_int '--prefill_sizes has "x", which is not an integer' --prefill_sizes=1,x
expect_bad prefill_too_big 'Capture size 9000 exceeds max_num_batched_tokens 8192' \
  --prefill_sizes=16,9000
expect_bad prefill_in_prefill_mode 'graph.prefill_sizes is for GRAPH_MODE_DECODE' \
  --graph_mode=prefill_only --prefill_sizes=64
expect_bad graph_execution 'Unknown --graph_execution "pw"; use full or piecewise' \
  --graph_execution=pw
expect_bad max_model_len 'max_model_len must be positive, got 0' --max_model_len=0
message='Capture size 300 exceeds max_num_seqs 256; remove it or raise max_num_seqs'
expect_bad capture_too_big "$message" --capture_sizes=1,300
expect_bad kv_dtype 'Unknown --kv_cache_dtype "int4"; use bf16, fp16, fp32 or fp8' \
  --kv_cache_dtype=int4
expect_bad tp_split 'does not split over tensor_parallel_size 3' --tensor_parallel_size=3
expect_bad svg_dir 'Cannot write --svg file' "--svg=$tmp/no/such/dir/plan.svg"
expect_bad svg_is_dir "--svg \"$tmp\" is a directory; give a file, e.g. \"$tmp/plan.svg\"" \
  "--svg=$tmp"
expect_bad config_is_dir "Cannot read config file \"$tmp\": Is a directory" "--config=$tmp"
# An empty value would leave an optional flag unset, planning its default.
expect_bad empty_number 'Flag --max_num_seqs is empty; give it a value or leave it out' \
  --max_num_seqs=
expect_bad empty_sizes 'Flag --capture_sizes is empty' --capture_sizes=
expect_bad empty_size_entry '--capture_sizes=1,,8 has an empty entry' --capture_sizes=1,,8
expect_bad size_out_of_range '--prefill_sizes has "99999999999", which is out of range' \
  --prefill_sizes=99999999999
expect_bad context_huge '--context 9223372036854775807 is above 16777216 tokens' \
  --context=9223372036854775807
# Adversarial flags: values at and past the types' limits, NaN, escapes, and flagfiles that absl
# would read for ever or exit on with its own status 1.
expect_bad utilization_nan 'gpu_memory_utilization nan is outside (0, 1]' --gpu_memory_utilization=nan
expect_bad utilization_inf 'gpu_memory_utilization inf is outside (0, 1]' --gpu_memory_utilization=inf
expect_bad total_negative 'Bad value "-1" for --gpu_total_bytes' --gpu_total_bytes=-1
expect_bad total_huge 'gpu.total_bytes 18446744073709551615 is more than a PiB' \
  --gpu_total_bytes=18446744073709551615
expect_bad seqs_past_int 'Bad value "2147483648" for --max_num_seqs' --max_num_seqs=2147483648
expect_bad seqs_int_max 'max_num_seqs 2147483647 is above 1048576' --max_num_seqs=2147483647
expect_bad context_past_int64 'Bad value "9223372036854775808" for --context' \
  --context=9223372036854775808
digits=123456789012345678901234567890
expect_bad size_many_digits "--capture_sizes has \"$digits\", which is out of range" \
  "--capture_sizes=1,$digits"
expect_bad size_hex '--capture_sizes has "0x10", which is not an integer' --capture_sizes=0x10
expect_bad size_negative 'Capture size -8 is not positive' --capture_sizes=' -8, 16'
expect_bad escape_in_value 'Unknown --kv_cache_dtype "\x1b[2J"' --kv_cache_dtype=$'\e[2J'
expect_bad preset_newline 'Unknown model preset "llama-3.1-8b\n"' --preset=$'llama-3.1-8b\n'
expect_bad negated_with_value 'Flag --nomeasure takes no value; give --measure=false' \
  --nomeasure=true
expect_bad negated_not_bool 'Flag --nomax_num_seqs: only plain boolean flags have a --no form' \
  --nomax_num_seqs
expect_bad query_group '128 query heads per KV head on a rank, above the 64' \
  --num_heads=256 --num_kv_heads=2 --head_dim=16
expect_bad flagfile_no_value 'Flag --flagfile needs a value' --flagfile
expect_bad flagfile_empty 'Flag --flagfile is empty' --flagfile=
printf -- '--flagfile=%s\n' "$tmp/self.flags" >"$tmp/self.flags"
expect_bad flagfile_self "--flagfile \"$tmp/self.flags\" is already being read" \
  "--flagfile=$tmp/self.flags"
printf -- '# tuned\n--max_num_seqs=8\n--bogus=1\n' >"$tmp/bogus.flags"
expect_bad flagfile_unknown "--flagfile \"$tmp/bogus.flags\" line 3: Unknown flag --bogus" \
  "--flagfile=$tmp/bogus.flags"
printf -- '--max_num_seqs=lots\n' >"$tmp/lots.flags"
expect_bad flagfile_bad_value "--flagfile \"$tmp/lots.flags\" line 1: Bad value \"lots\"" \
  "--flagfile=$tmp/lots.flags"
printf -- '--max_num_seqs=8\nllama\n' >"$tmp/positional.flags"
expect_bad flagfile_positional 'line 2: "llama" is not a flag' "--flagfile=$tmp/positional.flags"
expect_bad flagfile_device 'Cannot read --flagfile "/dev/zero": Is a device, not a regular file' \
  --flagfile=/dev/zero
printf -- '  --max_num_seqs=8\r\n\n# a comment\n' >"$tmp/good.flags"
expect_ok flagfile_good "--flagfile=$tmp/good.flags" &&
  expect_out flagfile_good 'Steps: max_num_seqs 8,'

# Paths and values holding an ESC, a newline and U+009B are named escaped, on one clean line.
mkdir -p "$tmp/$odd"
expect_bad svg_odd_dir \
  "--svg \"$tmp/$odd_escaped\" is a directory; give a file, e.g. \"$tmp/$odd_escaped/plan.svg\"" \
  "--svg=$tmp/$odd"
expect_clean svg_odd_dir
expect_bad svg_odd_unwritable "Cannot write --svg file \"$tmp/$odd_escaped/no/plan.svg\"; check" \
  "--svg=$tmp/$odd/no/plan.svg"
expect_clean svg_odd_unwritable
printf -- '--max_num_seqs=8\n--bogus=1\n' >"$tmp/$odd.flags"
expect_bad flagfile_odd "--flagfile \"$tmp/$odd_escaped.flags\" line 2: Unknown flag --bogus" \
  "--flagfile=$tmp/$odd.flags"
expect_clean flagfile_odd
# A path with a newline cannot be named inside a flagfile: the odd one names a file that names
# itself, and the chain read (of canonical paths) names both.
printf -- '--flagfile=%s\n' "$tmp/self.flags" >"$tmp/${odd}_top.flags"
message="--flagfile \"$tmp/${odd_escaped}_top.flags\" line 1: --flagfile \"$tmp/self.flags\" \
line 1: --flagfile \"$tmp/self.flags\" is already being read (\""
expect_bad flagfile_odd_loop "$message" "--flagfile=$tmp/${odd}_top.flags"
grep -qF -- "/${odd_escaped}_top.flags\" -> \"" "$tmp/err" ||
  fail "flagfile_odd_loop: the chain does not name the file escaped: $(cat -v "$tmp/err")"
expect_clean flagfile_odd_loop
printf -- '--max_num_seqs=8\n' >"$tmp/${odd}_good.flags"
message="--flagfile=$tmp/${odd_escaped}_good.flags,,x has an empty entry; list the files \
separated by single commas"
expect_bad flagfile_odd_empty_entry "$message" "--flagfile=$tmp/${odd}_good.flags,,x"
expect_clean flagfile_odd_empty_entry
expect_bad bad_number_odd "Bad value \"$odd_escaped\" for --max_num_seqs: " "--max_num_seqs=$odd"
expect_clean bad_number_odd
expect_bad positional_odd "Unexpected argument \"$odd_escaped\"; memory_planner takes only flags" \
  -- "$odd"
expect_clean positional_odd
expect_bad measure_gpu_odd "--gpu=$odd_escaped does not apply to --measure" --measure "--gpu=$odd"
expect_clean measure_gpu_odd
mkdir -p "$tmp/$odd/gemma"
printf '{"model_type": "gemma2", "hidden_size": 3584}' >"$tmp/$odd/gemma/config.json"
expect_bad model_dir_odd_config \
  "\"$tmp/$odd_escaped/gemma/config.json\": model_type \"gemma2\" is not a Llama-family decoder" \
  "--model_dir=$tmp/$odd/gemma"
expect_clean model_dir_odd_config
mkdir -p "$tmp/$odd/fp32"
cp "$tmp/Llama-fp32/config.json" "$tmp/$odd/fp32/"
if expect_ok model_dir_odd_fp32 "--model_dir=$tmp/$odd/fp32"; then
  grep -qF -- "--model_dir \"$tmp/$odd_escaped/fp32\" holds fp32 weights, which kiln rounds" \
    "$tmp/err" || fail "model_dir_odd_fp32: no escaped directory: $(cat -v "$tmp/err")"
  expect_clean model_dir_odd_fp32
fi

# Bad flags are named before the GPU is looked for (--gpu=auto, --measure), with or without one.
expect_bad gpu_auto_bad_flag 'max_num_seqs must be positive, got 0' --gpu=auto --max_num_seqs=0
expect_bad measure_bad_format 'Unknown --format "xml"' --measure --format=xml
expect_bad measure_bad_preset 'Unknown model preset "llama-9"' --measure --preset=llama-9
# What --measure cannot honour or build.
expect_bad measure_json '--format=json does not apply to --measure' --measure --format=json
expect_bad measure_svg '--svg does not apply to --measure' --measure "--svg=$tmp/plan.svg"
expect_bad measure_gpu '--gpu=h200 does not apply to --measure' --measure --gpu=h200
expect_bad measure_tp 'cannot measure tensor_parallel_size 4; set --tensor_parallel_size=1' \
  --measure "--config=$data/llama70b_tp4.textproto"
expect_bad measure_kv_dtype 'kv_cache_dtype fp8 is not supported; kiln'"'"'s KV cache is bf16' \
  --measure --kv_cache_dtype=fp8
expect_bad measure_head_dim 'refuses this config: Model "Llama-3.1-8B (modified)": Decode attention' \
  --measure --head_dim=96

# --gpu=auto reads GPU 0; on a machine without one it must say so (exit 2), not crash.
"$bin" --gpu=auto >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 0 ]; then
  grep -qF 'kiln memory plan:' "$tmp/out" || fail "gpu_auto: exit 0 without a table"
elif [ "$rc" -eq 2 ]; then
  grep -qF -- '--gpu=auto found no GPU' "$tmp/err" ||
    fail "gpu_auto: exit 2 without the no-GPU message: $(cat "$tmp/err")"
  [ -e /dev/nvidia0 ] && fail "gpu_auto: a GPU device node exists but no GPU was found"
else
  fail "gpu_auto: exit code $rc, want 0 (GPU) or 2 (no GPU); stderr: $(cat "$tmp/err")"
fi

finish
