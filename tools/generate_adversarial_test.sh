#!/usr/bin/env bash
# Runs //tools:generate on adversarial input, in two parts (each a test of its own, so that each
# stays short): "files" gives it config files, --logits_out paths and model directories that are
# not what they should be; "lists" sweeps --prompt_ids, --batch, --prompt_len and --gen_tokens with
# seeded random values, the outcome of each worked out here from the flag alone. Every bad input
# must exit with code 2 and its message; every good one passes the flag checks and is stopped by
# truncated weights (exit code 1, before the GPU is looked for), so this runs the same with or
# without a GPU and never starts a model.
set -uo pipefail

bin=tools/generate
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

part=${1:-}
llama=runtime/config/testdata/Llama-3.2-1B  # Llama-3.2-1B's config.json, no weights
header='{"model.norm.weight":{"dtype":"BF16","shape":[2048],"data_offsets":[0,4096]}}'
{
  printf "$(printf '\\x%02x' ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
  printf '%s' "$header"
  head -c 100 /dev/zero
} >"$tmp/truncated.safetensors"
trunc="--weights=$tmp/truncated.safetensors"
passes='has only 100 bytes of data'

files() {
  # Config files that are not config files: each refused at once (a FIFO must not block, /dev/zero
  # must not fill memory), exit code 2.
  mkfifo "$tmp/config.fifo"
  expect_bad config_fifo "Cannot read config file \"$tmp/config.fifo\": Is a FIFO" \
    "--config=$tmp/config.fifo"
  expect_bad config_dev_zero 'Cannot read config file "/dev/zero": Is a device' --config=/dev/zero
  : >"$tmp/huge.textproto"
  truncate -s 2G "$tmp/huge.textproto"  # sparse: no disk
  expect_bad config_huge 'it holds 2147483648 bytes, more than the 67108864' \
    "--config=$tmp/huge.textproto"
  for _ in $(seq 100); do printf '\x01\xff\x00\x1b[2J{[\x80"\\'; done >"$tmp/garbage.textproto"
  expect_bad config_garbage "Cannot parse $tmp/garbage.textproto as a kiln.config.PlannerConfig" \
    "--config=$tmp/garbage.textproto"
  printf 'gpu_memory_utilization: nan\n' >"$tmp/nan.textproto"
  expect_bad config_nan 'gpu_memory_utilization in '"$tmp"'/nan.textproto is nan; give a finite' \
    "--config=$tmp/nan.textproto"
  printf '{"kv_cache_dtype": 99}' >"$tmp/enum.json"
  expect_bad config_enum 'kv_cache_dtype in '"$tmp"'/enum.json is 99, which is no DType' \
    "--config=$tmp/enum.json"
  printf '{"graph": {"capture_sizes": [[1, 2]]}}' >"$tmp/nested.json"
  expect_bad config_nested \
    'graph.capture_sizes[0] in '"$tmp"'/nested.json is a list inside a list' \
    "--config=$tmp/nested.json"
  printf '{"x": %s%s}' "$(printf '[%.0s' $(seq 3000))" "$(printf ']%.0s' $(seq 3000))" \
    >"$tmp/deep.json"
  expect_bad config_deep 'its objects and lists nest 3001 deep, more than the 24 kiln reads' \
    "--config=$tmp/deep.json"
  # Every truncation of a config that cuts into its text is refused with the file's name; the
  # whole file (and its cut after the last line) passes.
  config=runtime/config/testdata/fastdeploy.json
  size=$(wc -c <"$config")
  for cut in 0 1 2 30 60 90 120 150 180 210 240 $((size - 2)); do
    head -c "$cut" "$config" >"$tmp/cut.json"
    expect_bad "config_cut_$cut" "$tmp/cut.json" "--config=$tmp/cut.json" "$trunc"
  done
  cp "$config" "$tmp/whole.json"
  expect_exit config_whole 1 "$passes" "--config=$tmp/whole.json" "$trunc" --batch=1

  # --logits_out: what cannot be written is refused before the run, which writes it only at the end.
  expect_bad logits_out_fifo "--logits_out \"$tmp/config.fifo\" is not a regular file" \
    "--logits_out=$tmp/config.fifo" --batch=1
  expect_bad logits_out_device '--logits_out "/dev/full" is not a regular file' \
    --logits_out=/dev/full --batch=1
  expect_bad logits_out_is_dir "--logits_out \"$tmp\" is a directory" "--logits_out=$tmp" --batch=1
  expect_bad logits_out_unwritable '--logits_out "/proc/kiln_logits.bin" cannot be written' \
    --logits_out=/proc/kiln_logits.bin --batch=1
  expect_bad logits_out_under_file \
    "--logits_out \"$tmp/whole.json/x.bin\"'s directory does not exist" \
    "--logits_out=$tmp/whole.json/x.bin" --batch=1
  expect_bad logits_out_too_big '--logits_out would keep 4.30 GiB of logits (--gen_tokens 9000' \
    "--logits_out=$tmp/logits.bin" --batch=1 --gen_tokens=9000 --max_model_len=10000
  [ -e "$tmp/logits.bin" ] && fail "logits_out: the probe left $tmp/logits.bin behind"
  expect_exit logits_out_ok 1 "$passes" "--logits_out=$tmp/logits.bin" --batch=1 "$trunc"
  [ -e "$tmp/logits.bin" ] && fail "logits_out_ok: the probe left $tmp/logits.bin behind"
  expect_bad load_threads_huge '--load_threads is 2147483647, more than 64' \
    --load_threads=2147483647
  expect_bad weights_device '--weights "/dev/zero" is not a regular file' --weights=/dev/zero
  expect_bad weights_commas '--weights=, names no file' --weights=,

  # --model_dir whose index names files outside the directory, or is a dangling link.
  mkdir -p "$tmp/escape"
  cp "$llama/config.json" "$tmp/escape/"
  for name in ../truncated.safetensors /etc/passwd "sub/../../x.safetensors" ""; do
    printf '{"weight_map": {"lm_head.weight": "%s"}}' "$name" \
      >"$tmp/escape/model.safetensors.index.json"
    expect_bad "model_dir_index_${name//\//_}" 'maps tensor "lm_head.weight" to' \
      "--model_dir=$tmp/escape"
  done
  printf '{"weight_map": {"lm_head.weight": 7}}' >"$tmp/escape/model.safetensors.index.json"
  expect_bad model_dir_index_number 'invalid value 7 for type TYPE_STRING' "--model_dir=$tmp/escape"
  rm "$tmp/escape/model.safetensors.index.json"
  ln -s "$tmp/escape/blobs/missing" "$tmp/escape/model.safetensors.index.json"
  : >"$tmp/escape/model-00001-of-00002.safetensors"
  expect_bad model_dir_dangling_index 'model.safetensors.index.json" is a link to nothing' \
    "--model_dir=$tmp/escape"
}

lists() {
  # Seeded sweeps of the lists and counts: each run's outcome is worked out here from the flag
  # alone (the first bad entry, in the order generate checks them) and compared.
  RANDOM=20240611
  vocab=128256
  # want_for_ints FLAG LIST: sets want (the message) for a list whose entries do not parse, or ""
  # when they all do; ids gets the parsed entries.
  want_for_ints() {
    local flag=$1 list=$2 rest=$2 entry empty=0
    want=""
    ids=()
    while :; do
      entry=${rest%%,*}
      if [ -z "$entry" ]; then
        empty=1
      elif [[ $entry =~ ^-?[0-9]+$ ]]; then
        if [ ${#entry} -gt 11 ] || [ "$entry" -gt 2147483647 ] || [ "$entry" -lt -2147483648 ]; then
          want="--$flag has \"$entry\", which is out of range"
          return
        fi
        ids+=("$entry")
      else
        want="--$flag has \"$entry\", which is not an integer"
        return
      fi
      [[ $rest == *,* ]] || break
      rest=${rest#*,}
    done
    if [ "$empty" -eq 1 ]; then
      want="--$flag=$list has an empty entry"
    fi
  }
  id_pool=(-1 "$vocab" 2147483647 2147483648 -2147483649 x 1e3 "" 99999999999999)
  for round in $(seq 1 18); do
    n=$((1 + RANDOM % 6))
    entries=()
    for _ in $(seq "$n"); do
      if [ $((RANDOM % 4)) -eq 0 ]; then
        entries+=("${id_pool[RANDOM % ${#id_pool[@]}]}")
      else
        entries+=($(((RANDOM * 4 + RANDOM) % vocab)))
      fi
    done
    list=$(IFS=,; echo "${entries[*]}")
    [ -z "$list" ] && list=","
    want_for_ints prompt_ids "$list"
    if [ -z "$want" ]; then
      for id in "${ids[@]}"; do
        if [ "$id" -lt 0 ] || [ "$id" -ge "$vocab" ]; then
          want="--prompt_ids has token $id, outside the model's vocabulary [0, $vocab)"
          break
        fi
      done
    fi
    if [ -z "$want" ]; then
      expect_exit "prompt_ids_sweep_$round" 1 "$passes" "--prompt_ids=$list" --batch=1 \
        --gen_tokens=2 "$trunc"
    else
      expect_bad "prompt_ids_sweep_$round" "$want" "--prompt_ids=$list" --batch=1 --gen_tokens=2 \
        "$trunc"
    fi
  done
  # A prompt of 5,000 ids (through a flagfile) is too long for the default max_model_len.
  printf -- '--prompt_ids=%s\n' "$(seq -s, 1 5000)" >"$tmp/long_ids.flags"
  expect_bad prompt_ids_long 'A prompt of 5000 tokens and 2 generated tokens exceed' \
    "--flagfile=$tmp/long_ids.flags" --batch=1 --gen_tokens=2 "$trunc"

  batch_pool=(0 -1 257 300 2147483648 x "")
  for round in $(seq 1 12); do
    n=$((1 + RANDOM % 4))
    entries=()
    for _ in $(seq "$n"); do
      if [ $((RANDOM % 3)) -eq 0 ]; then
        entries+=("${batch_pool[RANDOM % ${#batch_pool[@]}]}")
      else
        entries+=($((1 + RANDOM % 256)))
      fi
    done
    list=$(IFS=,; echo "${entries[*]}")
    [ -z "$list" ] && list=","
    want_for_ints batch "$list"
    if [ -z "$want" ]; then
      for b in "${ids[@]}"; do
        if [ "$b" -lt 1 ] || [ "$b" -gt 256 ]; then
          want="--batch $b is outside [1, --max_num_seqs 256]"
          break
        fi
      done
    fi
    if [ -z "$want" ]; then
      expect_exit "batch_sweep_$round" 1 "$passes" "--batch=$list" --prompt_len=4 --gen_tokens=2 \
        "$trunc"
    else
      expect_bad "batch_sweep_$round" "$want" "--batch=$list" --prompt_len=4 --gen_tokens=2 "$trunc"
    fi
  done

  count_pool=(0 -1 -2147483648 2147483647 4096 4097 1 2)
  for round in $(seq 1 12); do
    p=$((1 + RANDOM % 4200))
    g=$((1 + RANDOM % 4200))
    [ $((RANDOM % 2)) -eq 0 ] && p=${count_pool[RANDOM % ${#count_pool[@]}]}
    [ $((RANDOM % 2)) -eq 0 ] && g=${count_pool[RANDOM % ${#count_pool[@]}]}
    if [ "$p" -lt 1 ] || [ "$g" -lt 1 ]; then
      expect_bad "counts_sweep_$round" '--prompt_len and --gen_tokens must be positive' \
        "--prompt_len=$p" "--gen_tokens=$g" --batch=1 "$trunc"
    elif [ $((p + g - 1)) -gt 4096 ]; then
      expect_bad "counts_sweep_$round" "A prompt of $p tokens and $g generated tokens exceed" \
        "--prompt_len=$p" "--gen_tokens=$g" --batch=1 "$trunc"
    else
      expect_exit "counts_sweep_$round" 1 "$passes" "--prompt_len=$p" "--gen_tokens=$g" --batch=1 \
        "$trunc"
    fi
  done
}

case "$part" in
  files) files ;;
  lists) lists ;;
  *) fail "unknown part \"$part\"; give files or lists" ;;
esac
finish
