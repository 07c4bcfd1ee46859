#!/usr/bin/env bash
# Runs tools/bench's Python scripts with bad arguments and without their packages: each must
# print what is wrong on stderr and exit non-zero, never with a traceback. A stand-in torch that
# fails to import makes the run the same whether or not this machine has PyTorch (the scripts
# imported torch first, so without it every run ended in a ModuleNotFoundError traceback).
set -uo pipefail

bin=python3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source tools/cli_test_lib.sh

mkdir -p "$tmp/no_torch/torch"
echo 'raise ImportError("No module named torch (a test stand-in)")' \
  >"$tmp/no_torch/torch/__init__.py"
export PYTHONPATH="$tmp/no_torch"
export PYTHONDONTWRITEBYTECODE=1

# expect_script NAME SCRIPT CODE MESSAGE ARGS...: exit code CODE, MESSAGE on stderr, no traceback.
expect_script() {
  local name=$1 script=$2 code=$3 message=$4
  shift 4
  expect_exit "$name" "$code" "$message" "tools/bench/$script" "$@"
  if grep -q "Traceback" "$tmp/err"; then
    fail "$name: a traceback instead of a message: $(cat "$tmp/err")"
  fi
}

torch=torch_reference.py
expect_script model $torch 1 "--model='llama-9b': expected one of llama-3.2-1b" --model=llama-9b
expect_script variants $torch 1 "--variants='plain,fast': expected a comma-separated list" \
  --variants=plain,fast
expect_script variants_empty $torch 1 "--variants='': expected a comma-separated list" --variants=
expect_script norms $torch 1 "--norms='hf,rms': expected a comma-separated list of hf, fused" \
  --norms=hf,rms
expect_script batches_text $torch 1 "--batches='1,x': expected integers" --batches=1,x
expect_script batches_zero $torch 1 "--batches='8,0': every value must be >= 1" --batches=8,0
expect_script batches_empty $torch 1 "--batches='': expected integers" --batches=
expect_script prefill_text $torch 1 "--prefill='512,abc': expected integers" --prefill=512,abc
expect_script prefill_negative $torch 1 "--prefill='-1': every value must be >= 1" --prefill=-1
expect_script prefill_ignores_nothing $torch 1 "--variants='bogus'" --prefill=512 --variants=bogus
expect_script context $torch 1 "--context must be >= 2" --context=1
expect_script reps $torch 1 "--reps >= 1" --reps=0
expect_script warmup_text $torch 2 "argument --warmup: invalid int value: 'x'" --warmup=x
expect_script no_torch $torch 1 "needs PyTorch with CUDA (No module named torch (a test stand-in))"

hf=hf_reference_check.py
touch "$tmp/generate" && chmod +x "$tmp/generate"
expect_script shapes $hf 1 "--shapes='tiny,huge': unknown 'huge'; use a comma-separated list of" \
  --shapes=tiny,huge "--generate=$tmp/generate"
expect_script shapes_empty $hf 1 "unknown ''" --shapes=tiny,,1b "--generate=$tmp/generate"
expect_script prompt $hf 1 "--prompt=-5 and --layers=0 must be >= 0" --prompt=-5 \
  "--generate=$tmp/generate"
expect_script layers $hf 1 "--prompt=0 and --layers=-1 must be >= 0" --layers=-1 \
  "--generate=$tmp/generate"
expect_script generate_missing $hf 1 "--generate='$tmp/missing' is not an executable" \
  "--generate=$tmp/missing"
expect_script dtype $hf 2 "argument --dtype: invalid choice: 'int8'" --dtype=int8
expect_script no_packages $hf 1 \
  "needs torch, transformers with Qwen3 (4.51 or later) and safetensors" "--generate=$tmp/generate"

finish
