#!/usr/bin/env python3
"""Checks kiln's generation against Hugging Face transformers on the same checkpoint.

For each model shape it builds a LlamaForCausalLM with seeded weights (bf16, Llama 3's "llama3"
RoPE scaling; the "mistral" shape a MistralForCausalLM, the "qwen3" shape a Qwen3ForCausalLM, whose
q and k heads are RMS-normed before RoPE, and the "qwen2" shape a Qwen2ForCausalLM,
whose q, k and v projections have biases, both without scaling), saves it with save_pretrained
(config.json and safetensors, sharded for the 1B shape), runs kiln's generate on the directory
(--model_dir, --logits_out) and then evaluates the same weights in transformers over the prompt
and kiln's tokens (teacher forcing):
  - in float64 on the CPU: the reference. Per generated token, kiln's logits against it (relative
    L2 error), and kiln's token against its argmax where its top-2 margin is clear;
  - in bf16 on the GPU, as transformers users run it: its own error against the reference is the
    yardstick for kiln's (bf16 activations cost both about the same);
  - in float64 without the scaling (shapes that have one): kiln's logits must be clearly farther
    from it than from the reference, or the check could not tell that kiln applies the scaling.
transformers computes RoPE angles in float32 whatever the model's dtype, and its bf16 runs round
cos and sin to bf16. Its frequencies are kept in float32 here, as from_pretrained leaves them:
Module.to(bfloat16) rounds them too (0.4% off), and at 2000 tokens that alone put kiln 5.8% away
from a float64 reference built that way, against 1.6% from one with float32 frequencies.

With --dtype=float16 or float32 the checkpoint is saved in that type (config.json's torch_dtype
follows): kiln rounds each weight to bf16 as it loads, as transformers' bf16 run does, and the
float64 reference takes the saved values as they are.

Needs torch, transformers and safetensors, and a GPU for kiln:
  python3 tools/bench/hf_reference_check.py --generate=.gpu/bin/tools_generate
Exit code 0 when every shape passes, 1 otherwise.
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import safetensors  # noqa: F401 (save_pretrained writes safetensors files with it)
    import torch
    import transformers
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
except ImportError as error:  # reported by main() once the arguments are checked
    IMPORT_ERROR = error
else:
    IMPORT_ERROR = None

# Sizes; rope scaling as (factor, low_freq_factor, high_freq_factor, original length). kiln passes
# when its mean error is within `slack` times transformers' bf16 error (or under `tolerance`).
SHAPES = {
    # Two layers; an original length of 64 puts the pairs in all three bands at short positions.
    "tiny": dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1024,
                 theta=10000.0, scaling=(8.0, 1.0, 4.0, 64), tie=False, prompt=40, gen=24,
                 shard=None, tolerance=0.03, slack=1.5),
    # Llama 3.2 1B's shape and RoPE; a prompt long enough for the scaled bands to turn far.
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256,
               theta=500000.0, scaling=(32.0, 1.0, 4.0, 8192), tie=True, prompt=2000, gen=32,
               shard="800MB", tolerance=0.03, slack=1.5),
    # A Mistral (model_type "mistral", MistralForCausalLM): Mistral 7B v0.3's head_dim, vocabulary,
    # rope_theta and no sliding window, at a smaller width; no RoPE scaling.
    "mistral": dict(family="mistral", hidden=1024, layers=4, heads=8, kv_heads=2, head_dim=128,
                    ffn=3584, vocab=32768, theta=1000000.0, scaling=None, tie=False, prompt=600,
                    gen=16, shard=None, tolerance=0.03, slack=1.5),
    # A Qwen2 (model_type "qwen2", Qwen2ForCausalLM: q, k and v projections with a bias): Qwen2.5
    # 3B's grouping (16 over 2), vocabulary and rope_theta at a smaller width; no RoPE scaling.
    "qwen2": dict(family="qwen2", hidden=1024, layers=4, heads=16, kv_heads=2, head_dim=64,
                  ffn=2816, vocab=151936, theta=1000000.0, scaling=None, tie=True, prompt=600,
                  gen=16, shard=None, tolerance=0.03, slack=1.5),
    # Qwen2.5 7B's widths (hidden 3584, ffn 18944, vocab 152064), 7 query heads per KV head and
    # biases, with 4 of its 28 layers.
    "qwen2.5-7b": dict(family="qwen2", hidden=3584, layers=4, heads=28, kv_heads=4, head_dim=128,
                       ffn=18944, vocab=152064, theta=1000000.0, scaling=None, tie=False,
                       prompt=1000, gen=16, shard="2GB", tolerance=0.03, slack=1.5),
    # A Qwen3 (model_type "qwen3", Qwen3ForCausalLM: each q and k head RMS-normed before RoPE):
    # Qwen3 0.6B's widths, whose 16 query heads of 128 are twice as wide together as the model
    # (hidden 1024), 2 query heads per KV head, with 4 of its 28 layers.
    "qwen3": dict(family="qwen3", hidden=1024, layers=4, heads=16, kv_heads=8, head_dim=128,
                  ffn=3072, vocab=151936, theta=1000000.0, scaling=None, tie=True, prompt=600,
                  gen=16, shard=None, tolerance=0.03, slack=1.5),
    # Llama 3.2 3B's widths and 3 query heads per KV head, with 4 of its 28 layers.
    "3b": dict(hidden=3072, layers=4, heads=24, kv_heads=8, head_dim=128, ffn=8192, vocab=128256,
               theta=500000.0, scaling=(32.0, 1.0, 4.0, 8192), tie=True, prompt=1000, gen=16,
               shard="2GB", tolerance=0.03, slack=1.5),
    # Llama 2 7B's widths (ffn 11008), one query head per KV head (multi-head attention), vocab
    # 32000 and no RoPE scaling, with 4 of its 32 layers, saved in float16 as Llama 2's checkpoints
    # are (its own dtype unless --dtype says otherwise).
    "llama2-7b": dict(hidden=4096, layers=4, heads=32, kv_heads=32, head_dim=128, ffn=11008,
                      vocab=32000, theta=10000.0, scaling=None, tie=False, prompt=1000, gen=16,
                      shard="2GB", tolerance=0.03, slack=1.5, dtype="float16"),
    # Llama 3.1 8B's widths, heads, untied LM head and RoPE with 4 of its 32 layers: every kernel
    # at head_dim 128, hidden 4096 and ffn 14336, while the float64 reference fits the host.
    "8b": dict(hidden=4096, layers=4, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
               theta=500000.0, scaling=(8.0, 1.0, 4.0, 8192), tie=False, prompt=1000, gen=16,
               shard="2GB", tolerance=0.03, slack=1.5),
}


FAMILIES = {} if IMPORT_ERROR is not None else {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def model_class(s):
    return FAMILIES[s.get("family", "llama")][1]


def make_config(s, scaled=True):
    scaled = scaled and s["scaling"] is not None
    scaling = {"rope_type": "default"}
    if scaled:
        factor, low, high, original = s["scaling"]
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                   "high_freq_factor": high, "original_max_position_embeddings": original}
    common = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                  num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                  head_dim=s["head_dim"], intermediate_size=s["ffn"], vocab_size=s["vocab"],
                  rms_norm_eps=1e-5, tie_word_embeddings=s["tie"], hidden_act="silu",
                  max_position_embeddings=131072)
    family = s.get("family", "llama")
    config_class = FAMILIES[family][0]
    if family == "mistral":
        common.update(sliding_window=None)
    elif family == "qwen2":
        common.update(use_sliding_window=False)
    elif family == "qwen3":
        common.update(use_sliding_window=False, attention_bias=False)
    else:
        common.update(attention_bias=False, mlp_bias=False)
    if int(transformers.__version__.split(".")[0]) >= 5:
        return config_class(rope_parameters=dict(scaling, rope_theta=s["theta"]), **common)
    return config_class(rope_theta=s["theta"], rope_scaling=scaling if scaled else None,
                        **common)


def kiln_frequencies(s):
    """attention/rope_frequency.h's RopeFrequency, in float64."""
    factor, low, high, original = s["scaling"]
    out = []
    for i in range(s["head_dim"] // 2):
        freq = 2.0 ** (-2.0 * i / s["head_dim"] * math.log2(s["theta"]))
        keep_from = 2 * math.pi * high / original
        divide_below = 2 * math.pi * low / original
        if freq >= keep_from:
            out.append(freq)
        elif freq < divide_below:
            out.append(freq * (1.0 / factor))
        else:
            blend = freq * (original / (2 * math.pi * (high - low))) - low / (high - low)
            out.append((1 - blend) * freq * (1.0 / factor) + blend * freq)
    return torch.tensor(out, dtype=torch.float64)


def make_model(s, seed, scaled=True, dtype=None):
    # dtype None: bf16 (a default of torch.bfloat16 would need torch to load this file).
    dtype = torch.bfloat16 if dtype is None else dtype
    torch.manual_seed(seed)
    model = model_class(s)(make_config(s, scaled))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # projections [out, in] (unit-variance outputs) and the embedding
                a = 1.0 if "embed_tokens" in name else math.sqrt(3.0 / p.shape[1])
                p.uniform_(-a, a)
            elif name.endswith(".bias"):  # Qwen2's q, k and v biases
                p.uniform_(-0.5, 0.5)
            else:  # norm weights
                p.uniform_(0.75, 1.25)
    return model.to(dtype).eval()


def save(model, directory, shard):
    kwargs = {"safe_serialization": True}
    if shard:
        kwargs["max_shard_size"] = shard
    try:
        model.save_pretrained(directory, **kwargs)
    except TypeError:  # transformers without safe_serialization (always safetensors)
        kwargs.pop("safe_serialization")
        model.save_pretrained(directory, **kwargs)


def run_kiln(generate, directory, prompt, gen, out):
    cmd = [generate, f"--model_dir={directory}", "--batch=1", f"--gen_tokens={gen}",
           "--prompt_ids=" + ",".join(map(str, prompt)), f"--logits_out={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kiln generate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    with open(out, "rb") as f:
        steps, vocab = struct.unpack("<ii", f.read(8))
        tokens = list(struct.unpack(f"<{steps}i", f.read(4 * steps)))
        logits = torch.frombuffer(bytearray(f.read(4 * steps * vocab)), dtype=torch.float32)
    return tokens, logits.view(steps, vocab).double()


def load(s, state, dtype, device, scaled=True):
    """The weights `state` in a model of `dtype` on `device`, its RoPE frequencies in float32 as
    from_pretrained leaves them (Module.to(dtype) rounds the rotary embedding's buffers too: to
    bf16, 0.4% off, which turns long-range attention)."""
    model = model_class(s)(make_config(s, scaled))
    freqs = model.model.rotary_emb.inv_freq.clone()  # float32
    model.load_state_dict(state)
    model = model.to(device=device, dtype=dtype).eval()
    model.model.rotary_emb.inv_freq = freqs.to(device)
    return model


def logits_at(model, prompt, tokens):
    """`model`'s logits (as float64 on the CPU) at the positions that sampled each of `tokens`
    (teacher forcing)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens[:-1]], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:]
    return out.to(device="cpu", dtype=torch.float64)


def compare(kiln, ref, tokens, tolerance):
    rel = ((kiln - ref).norm(dim=1) / ref.norm(dim=1)).tolist()
    top2 = ref.topk(2, dim=1)
    clear = matched = 0
    for i, token in enumerate(tokens):
        margin = (top2.values[i, 0] - top2.values[i, 1]).item()
        rms = ref[i].norm().item() / math.sqrt(ref.shape[1])
        if margin > 8 * tolerance * rms:
            clear += 1
            matched += int(token == top2.indices[i, 0].item())
    return max(rel), sum(rel) / len(rel), clear, matched


def mean_error(a, ref):
    return ((a - ref).norm(dim=1) / ref.norm(dim=1)).mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generate", default=".gpu/bin/tools_generate",
                        help="kiln's generate binary")
    parser.add_argument("--shapes", default="tiny,1b",
                        help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=0, help="prompt length (0: the shape's)")
    parser.add_argument("--layers", type=int, default=0, help="layers (0: the shape's)")
    parser.add_argument("--unscaled", action="store_true", help="models without RoPE scaling")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                        help="the type the checkpoint is saved in (default: the shape's, else "
                             "bfloat16)")
    parser.add_argument("--no_control", action="store_true",
                        help="skip the unscaled model (its check passes)")
    args = parser.parse_args()
    # Every argument is checked before the packages are needed and before any model is built.
    unknown = [repr(k) for k in args.shapes.split(",") if k not in SHAPES]
    if unknown:
        sys.exit(f"hf_reference_check: --shapes={args.shapes!r}: unknown {', '.join(unknown)}; "
                 f"use a comma-separated list of {', '.join(SHAPES)}")
    if args.prompt < 0 or args.layers < 0:
        sys.exit(f"hf_reference_check: --prompt={args.prompt} and --layers={args.layers} must be "
                 ">= 0 (0: the shape's own)")
    if shutil.which(args.generate) is None:
        sys.exit(f"hf_reference_check: --generate={args.generate!r} is not an executable; build "
                 "kiln's generate (tools/generate) and pass its path")
    if IMPORT_ERROR is not None:
        sys.exit(f"hf_reference_check: needs torch, transformers with Qwen3 (4.51 or later) and "
                 f"safetensors ({IMPORT_ERROR}); install them, e.g. pip install torch "
                 "transformers safetensors")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failed = False
    for key in args.shapes.split(","):
        s = dict(SHAPES[key])
        if args.prompt:
            s["prompt"] = args.prompt
        if args.layers:
            s["layers"] = args.layers
        work = tempfile.mkdtemp(prefix=f"kiln_hf_{key}_")
        try:
            scaled = not args.unscaled and s["scaling"] is not None
            dtype = args.dtype or s.get("dtype", "bfloat16")
            model = make_model(s, args.seed, scaled, getattr(torch, dtype))
            state = model.state_dict()
            freq_diff = 0.0
            if scaled:
                hf_freq = model_class(s)(make_config(s)).model.rotary_emb.inv_freq.double()
                mine = kiln_frequencies(s)
                freq_diff = ((hf_freq - mine).abs() / mine).max().item()
                print(f"{key}: RoPE frequencies, transformers (float32) against kiln's: max rel "
                      f"diff {freq_diff:.2e}")
            directory = os.path.join(work, f"{s.get('family', 'llama')}-{key}")
            save(model, directory, s["shard"])
            files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
            with open(os.path.join(directory, "config.json")) as f:
                saved = json.load(f)
            print(f"{key}: config.json " + ", ".join(
                f"{k} {json.dumps(saved[k])}" for k in
                ("rope_parameters", "rope_scaling", "rope_theta", "dtype", "torch_dtype")
                if k in saved))
            g = torch.Generator().manual_seed(args.seed)
            prompt = torch.randint(0, s["vocab"], (s["prompt"],), generator=g).tolist()
            tokens, kiln = run_kiln(args.generate, directory, prompt, s["gen"],
                                    os.path.join(work, "kiln.bin"))
            ref = logits_at(load(s, state, torch.float64, "cpu", scaled), prompt, tokens)
            worst, mean, clear, matched = compare(kiln, ref, tokens, s["tolerance"])
            gpu = "cuda" if torch.cuda.is_available() else "cpu"
            hf_bf16 = mean_error(
                logits_at(load(s, state, torch.bfloat16, gpu, scaled), prompt, tokens), ref)
            control = math.inf if args.no_control or not scaled else mean_error(
                kiln, logits_at(load(s, state, torch.float64, "cpu", False), prompt, tokens))
            ok = (mean < max(s["tolerance"], s["slack"] * hf_bf16) and matched == clear
                  and control > 1.5 * mean and freq_diff < 1e-5)
            failed = failed or not ok
            print(f"{key}: {s['layers']} layers, {len(files)} {dtype} safetensors file(s), prompt "
                  f"{len(prompt)}, "
                  f"{len(tokens)} tokens; kiln's logits against transformers float64: rel err "
                  f"mean {mean:.2e}, max {worst:.2e}; transformers bf16 ({gpu}) against it: "
                  f"mean {hf_bf16:.2e}; clear-margin tokens {matched}/{clear} match; "
                  + (f"kiln against the unscaled float64 model: mean {control:.2e}; "
                     if math.isfinite(control) else "")
                  + ("PASS" if ok else "FAIL"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
