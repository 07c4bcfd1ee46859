#!/usr/bin/env python3
"""PyTorch reference for kiln's decode step: a Llama shape, eager and CUDA graph.

    python3 tools/bench/torch_reference.py [--model llama-3.2-1b] [--batches 1,8,32,128]
        [--context 1024] [--variants plain,grouped,compiled,autotuned] [--norms fused,hf]

The model (--model): llama-3.2-1b, the 1B-class shape of kiln's figures (hidden 2048, 16 layers,
32/8 heads of 64, ffn 8192, vocab 128256, tied embeddings), llama-3.2-3b (hidden 3072, 28 layers,
24/8 heads of 128, ffn 8192, tied), llama-3.1-8b (hidden 4096, 32 layers, 32/8 heads of 128, ffn
14336, its own LM head), each with Llama 3's RoPE scaling, qwen2.5-7b (hidden 3584, 28 layers,
28/4 heads of 128, ffn 18944, vocab 152064, QKV bias, no scaling) or qwen3-8b (hidden 4096, 36
layers, 32/8 heads of 128, ffn 12288, vocab 151936, each q and k head RMS-normed before RoPE, no
scaling) or qwen3-4b (the same heads beside a hidden size of 2560, ffn 9728, tied); random bf16
weights, over a
plain, non-paged KV cache of `context` positions per sequence that starts full of random values:
each decode step writes the new K/V at position context - 1 and attends over all `context`
positions. The step ends with the logits and a greedy argmax.

Variants (each with every RMSNorm of --norms: hf, transformers' float32 form of six operations,
or fused, PyTorch's F.rms_norm):
  plain     as a Hugging Face Llama runs: fused QKV and gate-up projections, rotate-half RoPE of q
            and of k from a cos/sin table, F.scaled_dot_product_attention with enable_gqa.
  grouped   the same arithmetic written for speed: the G query heads of a KV head are G query
            rows of that head, so attention needs no repeated K/V and SDPA may take a fused
            kernel; RoPE rotates q and k in one pass.
  compiled  grouped, with everything between two attentions (norms, projections, RoPE, residual
            adds, SiLU·mul) and the LM head compiled by torch.compile (Inductor fuses the
            elementwise work; the matrix products stay cuBLAS's).
  autotuned compiled in Inductor's max-autotune-no-cudagraphs mode (matrix products also from
            Triton templates, each timed at compile; minutes of compiling; not in the default
            list).

Times one decode step per batch size with CUDA events after warm-up and prints medians: eager,
and replaying one torch.cuda.CUDAGraph of the step (inputs in static tensors); then the fastest
graph of any variant per batch, which is the figure to compare kiln with. Each variant's tokens
are checked against the first variant's (a note where they differ). The floor column is the weight
bytes a step reads (every tensor once; an embedding table the LM head does not share, only in the
rows it gathers) + KV cache bytes, read once at the measured device-to-device copy bandwidth. Writes the tables as
JSON to $OUT/torch_reference.json when $OUT is set.

With --prefill=N1,N2,... it times prefill instead: one prompt of N tokens through every layer
(F.scaled_dot_product_attention with is_causal over the prompt, the K/V written to the cache) and
the last token's logits and argmax, as a serving engine's first step; eager and compiled (the
pieces between attentions by torch.compile), median of --reps after --warmup, with the step's
matrix FLOPs and the rate they come to. kiln's figure: `generate --batch=1 --prompt_len=N
--gen_tokens=1` ("prefill ms").
"""
import argparse
import json
import math
import os
import statistics

try:
    import torch
    import torch._dynamo
    import torch.nn.functional as F
except ImportError as error:  # reported by main() once the arguments are checked
    TORCH_IMPORT_ERROR = error
else:
    TORCH_IMPORT_ERROR = None

# The shapes kiln's presets of the same names give (runtime/config/presets.cc); rope_scaling is
# llama3's: factor, low_freq_factor, high_freq_factor, original length (None: none); bias: the
# QKV projection's (Qwen2); qk_norm: each q and k head RMS-normed before RoPE (Qwen3).
LLAMA3 = dict(theta=500000.0, bias=False, qk_norm=False)
MODELS = {
    "llama-3.2-1b": dict(LLAMA3, hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                         ffn=8192, vocab=128256, tied=True, scaling=(32.0, 1.0, 4.0, 8192)),
    "llama-3.2-3b": dict(LLAMA3, hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128,
                         ffn=8192, vocab=128256, tied=True, scaling=(32.0, 1.0, 4.0, 8192)),
    "llama-3.1-8b": dict(LLAMA3, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                         ffn=14336, vocab=128256, tied=False, scaling=(8.0, 1.0, 4.0, 8192)),
    "qwen2.5-7b": dict(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, ffn=18944,
                       vocab=152064, tied=False, scaling=None, theta=1000000.0, bias=True,
                       qk_norm=False),
    "qwen3-8b": dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                     vocab=151936, tied=False, scaling=None, theta=1000000.0, bias=False,
                     qk_norm=True),
    "qwen3-4b": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728,
                     vocab=151936, tied=True, scaling=None, theta=1000000.0, bias=False,
                     qk_norm=True),
}
RMS_EPS = 1e-5


def use_model(name):
    """Sets the module's shape constants to MODELS[name]'s."""
    global HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, TIED, ROPE_SCALING, ROPE_THETA
    global QKV_BIAS, QK_NORM
    m = MODELS[name]
    HIDDEN, LAYERS, HEADS, KV_HEADS = m["hidden"], m["layers"], m["heads"], m["kv_heads"]
    HEAD_DIM, FFN, VOCAB, TIED, ROPE_SCALING = (m["head_dim"], m["ffn"], m["vocab"], m["tied"],
                                                m["scaling"])
    ROPE_THETA, QKV_BIAS, QK_NORM = m["theta"], m["bias"], m["qk_norm"]


use_model("llama-3.2-1b")


def llama3_scaled(inv_freq):
    # As transformers' "llama3" rope type: keep short wavelengths, divide long ones by the
    # factor, blend between. Computed once, so it costs the step nothing.
    if ROPE_SCALING is None:
        return inv_freq
    factor, low, high, original = ROPE_SCALING
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, blended, scaled)


def rms_norm_hf(x, weight):
    # As transformers' LlamaRMSNorm: normalise in float32, scale in the activation dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return weight * xf.to(x.dtype)


def rms_norm_fused(x, weight):
    # PyTorch's own RMSNorm: one fused kernel instead of the six above.
    return F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS)


NORMS = {"hf": rms_norm_hf, "fused": rms_norm_fused}
VARIANTS = ("plain", "grouped", "compiled", "autotuned")
DEFAULT_VARIANTS = ("plain", "grouped", "compiled")


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def make_pieces(rms_norm, variant):
    """The step's work between attentions: (before, after, head) for one variant."""

    def before(x, ln, wqkv, bqkv, qn, kn, cos, sin):
        # x [B, H] -> q [B, HEADS, D], k and v [B, KV_HEADS, D]; bqkv: the QKV bias or None; qn,
        # kn: the QK norms' weights or None.
        b = x.shape[0]
        qkv = F.linear(rms_norm(x, ln), wqkv, bqkv)
        if variant == "plain" or qn is not None:
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
            q = q.view(b, HEADS, HEAD_DIM)
            k = k.view(b, KV_HEADS, HEAD_DIM)
            if qn is not None:  # as Qwen3's attention: the norms over head_dim, then RoPE
                q, k = rms_norm(q, qn), rms_norm(k, kn)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        else:
            qk, v = qkv.split([(HEADS + KV_HEADS) * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
            qk = qk.view(b, HEADS + KV_HEADS, HEAD_DIM)
            q, k = (qk * cos + rotate_half(qk) * sin).split([HEADS, KV_HEADS], 1)
        return q, k, v.view(b, KV_HEADS, HEAD_DIM)

    def after(x, o, wo, ln, wgu, wdown):
        x = x + o @ wo.t()
        gate, up = (rms_norm(x, ln) @ wgu.t()).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ wdown.t()

    def head(x, norm, embed):
        return (rms_norm(x, norm) @ embed.t()).argmax(dim=-1)

    def prefill_before(x, ln, wqkv, bqkv, qn, kn, cos, sin):
        # x [P, H] of one prompt -> q [1, HEADS, P, D], k and v [1, KV_HEADS, P, D].
        p = x.shape[0]
        qkv = F.linear(rms_norm(x, ln), wqkv, bqkv)
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(p, HEADS, HEAD_DIM)
        k = k.view(p, KV_HEADS, HEAD_DIM)
        if qn is not None:
            q, k = rms_norm(q, qn), rms_norm(k, kn)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return (q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                v.view(p, KV_HEADS, HEAD_DIM).transpose(0, 1).unsqueeze(0))

    if variant == "prefill":
        return torch.compile(prefill_before, dynamic=False), torch.compile(after, dynamic=False), \
            torch.compile(head, dynamic=False)
    if variant == "prefill_eager":
        return prefill_before, after, head

    if variant in ("compiled", "autotuned"):
        mode = "max-autotune-no-cudagraphs" if variant == "autotuned" else None

        def jit(f):
            return torch.compile(f, fullgraph=True, dynamic=False, mode=mode)

        return jit(before), jit(after), jit(head)
    return before, after, head


class Llama:
    def __init__(self, max_batch, context, device):
        g = torch.Generator(device=device).manual_seed(0)
        bf = torch.bfloat16

        def uniform(*shape, scale):
            return ((torch.rand(*shape, generator=g, device=device) * 2 - 1) * scale).to(bf)

        qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        self.embed = uniform(VOCAB, HIDDEN, scale=math.sqrt(3))
        self.lm_head = (self.embed if TIED else
                        uniform(VOCAB, HIDDEN, scale=math.sqrt(3 / HIDDEN)))
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(dict(
                ln1=1 + uniform(HIDDEN, scale=0.25),
                wqkv=uniform(qkv_rows, HIDDEN, scale=math.sqrt(3 / HIDDEN)),
                bqkv=uniform(qkv_rows, scale=0.5) if QKV_BIAS else None,
                qn=1 + uniform(HEAD_DIM, scale=0.25) if QK_NORM else None,
                kn=1 + uniform(HEAD_DIM, scale=0.25) if QK_NORM else None,
                wo=uniform(HIDDEN, HEADS * HEAD_DIM, scale=math.sqrt(3 / (HEADS * HEAD_DIM))),
                ln2=1 + uniform(HIDDEN, scale=0.25),
                wgu=uniform(2 * FFN, HIDDEN, scale=math.sqrt(3 / HIDDEN)),
                wdown=uniform(HIDDEN, FFN, scale=math.sqrt(3 / FFN)),
            ))
        self.norm = 1 + uniform(HIDDEN, scale=0.25)
        cache_shape = (LAYERS, max_batch, KV_HEADS, context, HEAD_DIM)
        self.k_cache = uniform(*cache_shape, scale=1.0)
        self.v_cache = uniform(*cache_shape, scale=1.0)
        dims = torch.arange(0, HEAD_DIM, 2, device=device).float()
        inv_freq = llama3_scaled(1.0 / (ROPE_THETA ** (dims / HEAD_DIM)))
        freqs = torch.outer(torch.arange(context, device=device).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(bf), emb.sin().to(bf)  # [context, head_dim]
        self.context = context
        self.use(rms_norm_fused, "plain")

    def use(self, rms_norm, variant):
        # Compiled pieces of an earlier variant share these functions' code objects: drop them,
        # so that each variant compiles once per batch size within Dynamo's recompile limit.
        torch._dynamo.reset()
        self.variant = variant
        self.before, self.after, self.head = make_pieces(rms_norm, variant)

    def weight_bytes(self):
        n = self.embed.numel() + self.norm.numel()
        if self.lm_head is not self.embed:
            n += self.lm_head.numel()
        for layer in self.layers:
            n += sum(t.numel() for t in layer.values() if t is not None)
        return 2 * n

    def step_read_bytes(self, tokens):
        """Weight bytes a step of `tokens` rows reads: every tensor once, except an embedding
        table the LM head does not share, of which only the gathered rows."""
        if self.lm_head is self.embed:
            return self.weight_bytes()
        vocab, hidden = self.embed.shape
        return self.weight_bytes() - 2 * self.embed.numel() + 2 * min(tokens, vocab) * hidden

    def kv_bytes(self, batch):
        return 2 * LAYERS * batch * KV_HEADS * self.context * HEAD_DIM * 2

    def prefill(self, tokens):
        """tokens: int64 [P], one prompt from position 0. Returns its next token ([1])."""
        p = tokens.shape[0]
        x = self.embed[tokens]  # [P, H]
        cos = self.cos[:p].view(p, 1, HEAD_DIM)
        sin = self.sin[:p].view(p, 1, HEAD_DIM)
        for l, w in enumerate(self.layers):
            q, k, v = self.before(x, w["ln1"], w["wqkv"], w["bqkv"], w["qn"], w["kn"], cos, sin)
            self.k_cache[l, :1, :, :p] = k
            self.v_cache[l, :1, :, :p] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = self.after(x, o[0].transpose(0, 1).reshape(p, HEADS * HEAD_DIM), w["wo"],
                           w["ln2"], w["wgu"], w["wdown"])
        return self.head(x[-1:], self.norm, self.lm_head)

    def matrix_flops(self, p):
        """The prefill's matrix FLOPs: every layer's projections over p tokens, causal attention
        (q·k and p·v over the p(p+1)/2 pairs) and the LM head for the last token."""
        per_token = (HEADS + 2 * KV_HEADS) * HEAD_DIM * HIDDEN + HIDDEN * HEADS * HEAD_DIM + \
            3 * FFN * HIDDEN
        attention = 2 * HEADS * HEAD_DIM * p * (p + 1) // 2
        return 2 * (LAYERS * (per_token * p + attention) + VOCAB * HIDDEN)

    def step(self, tokens, pos):
        """tokens: int64 [B]; pos: int64 [1], the position every sequence writes. Returns [B]."""
        b = tokens.shape[0]
        x = self.embed[tokens]  # [B, H]
        cos = self.cos[pos].view(1, 1, HEAD_DIM)
        sin = self.sin[pos].view(1, 1, HEAD_DIM)
        for l, w in enumerate(self.layers):
            q, k, v = self.before(x, w["ln1"], w["wqkv"], w["bqkv"], w["qn"], w["kn"], cos, sin)
            kc, vc = self.k_cache[l, :b], self.v_cache[l, :b]  # [B, KV, T, D]
            kc.index_copy_(2, pos, k.unsqueeze(2))
            vc.index_copy_(2, pos, v.unsqueeze(2))
            if self.variant == "plain":
                o = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, enable_gqa=True)
            else:
                # Query head h belongs to KV head h // G (as transformers' repeat_kv): the G
                # heads of a KV head are G rows of one query, none masked.
                o = F.scaled_dot_product_attention(
                    q.reshape(b, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), kc, vc)
            x = self.after(x, o.reshape(b, HEADS * HEAD_DIM), w["wo"], w["ln2"], w["wgu"],
                           w["wdown"])
        return self.head(x, self.norm, self.lm_head)


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        fn()
        stop[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, stop))


def copy_bandwidth():
    """Device-to-device copy rate in bytes/s, counting bytes read plus written."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), 3, 10)
    return 2 * a.numel() / (ms * 1e-3)


def parse_list(text, allowed, flag):
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if not items or bad:
        raise SystemExit(f"torch_reference: {flag}={text!r}: expected a comma-separated list of "
                         f"{', '.join(allowed)}")
    return items


def parse_ints(text, flag, example):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"torch_reference: {flag}={text!r}: expected integers, e.g. {example}")
    if not values or min(values) < 1:
        raise SystemExit(f"torch_reference: {flag}={text!r}: every value must be >= 1")
    return values


def run_prefill(args, lengths):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.recompile_limit = max(8, 2 * len(lengths))
    device = torch.device("cuda")
    model = Llama(1, max(lengths), device)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{args.model} shape, prefill of one prompt (ms, median of {args.reps})")
    rows = []
    with torch.inference_mode():
        for variant in ("prefill_eager", "prefill"):
            torch._dynamo.reset()
            model.before, model.after, model.head = make_pieces(rms_norm_fused, variant)
            name = "eager" if variant == "prefill_eager" else "compiled"
            print(f"\n{name}\n{'tokens':>7} {'ms':>9} {'TFLOP/s':>9}")
            for p in lengths:
                tokens = torch.randint(0, VOCAB, (p,), device=device,
                                       generator=torch.Generator(device=device).manual_seed(p))
                ms = median_ms(lambda: model.prefill(tokens), max(args.warmup, 3), args.reps)
                rate = model.matrix_flops(p) / (ms * 1e-3) / 1e12
                print(f"{p:>7} {ms:>9.3f} {rate:>9.1f}")
                rows.append(dict(variant=name, tokens=p, ms=ms, tflops=rate))
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "torch_reference_prefill.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           model=args.model, rows=rows), f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-3.2-1b",
                        help="shape: " + ", ".join(MODELS) + " (kiln's presets of those names)")
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="step variants: plain, grouped, compiled, autotuned (see the "
                        "module docstring)")
    parser.add_argument("--norms", default="fused",
                        help="RMSNorm forms: fused (F.rms_norm), hf (transformers' six operations)")
    parser.add_argument("--prefill", default="",
                        help="prompt lengths: time a prefill of each instead of decode steps")
    args = parser.parse_args()
    # Every argument is checked before torch is needed, so a bad one is named even where torch is
    # missing, and none is ignored because another mode was picked.
    if args.warmup < 0 or args.reps < 1:
        raise SystemExit("torch_reference: --warmup must be >= 0 and --reps >= 1")
    if args.model not in MODELS:
        raise SystemExit(f"torch_reference: --model={args.model!r}: expected one of "
                         f"{', '.join(MODELS)}")
    batches = parse_ints(args.batches, "--batches", "1,8,32,128")
    if args.context < 2:
        raise SystemExit("torch_reference: --context must be >= 2")
    variants = parse_list(args.variants, VARIANTS, "--variants")
    norms = parse_list(args.norms, tuple(NORMS), "--norms")
    lengths = parse_ints(args.prefill, "--prefill", "512,2048") if args.prefill else None
    if TORCH_IMPORT_ERROR is not None:
        raise SystemExit(f"torch_reference: needs PyTorch with CUDA ({TORCH_IMPORT_ERROR}); "
                         "install it, e.g. pip install torch")
    if not torch.cuda.is_available():
        raise SystemExit("torch_reference: needs a CUDA GPU, and torch.cuda.is_available() is "
                         "False; run it on the GPU kiln runs on")
    use_model(args.model)
    if args.prefill:
        return run_prefill(args, lengths)
    torch.backends.cuda.matmul.allow_tf32 = False
    # One compilation per batch size and piece.
    torch._dynamo.config.recompile_limit = max(8, 2 * len(batches))
    device = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"copy bandwidth {bw / 1e12:.2f} TB/s")
    model = Llama(max(batches), args.context, device)
    print(f"{args.model} shape decode step, context {args.context}, "
          f"{model.weight_bytes() / 2**30:.2f} GiB of weights (ms, median of {args.reps})")
    rows = []
    reference = {}  # batch -> the first variant's tokens
    with torch.inference_mode():
        inputs = {b: torch.randint(0, VOCAB, (b,), device=device,
                                   generator=torch.Generator(device=device).manual_seed(b))
                  for b in batches}
        pos = torch.tensor([args.context - 1], device=device)
        for variant in variants:
            for norm in norms:
                model.use(NORMS[norm], variant)
                print(f"\n{variant}, RMSNorm {norm}")
                print(f"{'batch':>6} {'eager':>9} {'graph':>9} {'floor':>9}")
                for b in batches:
                    tokens = inputs[b]
                    eager = median_ms(lambda: model.step(tokens, pos), args.warmup, args.reps)
                    # Warm up on a side stream before capture, as torch.cuda.graphs recommends.
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(3):
                            model.step(tokens, pos)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        out = model.step(tokens, pos)
                    graph_ms = median_ms(graph.replay, args.warmup, args.reps)
                    # The graph computes what eager does, and every variant what plain does
                    # (reported, not fatal: other kernels may round differently).
                    torch.cuda.synchronize()
                    eager_out = model.step(tokens, pos)
                    if not torch.equal(out, eager_out):
                        print(f"  note: batch {b}: graph replay tokens differ from eager")
                    if b in reference and not torch.equal(eager_out, reference[b]):
                        differ = int((eager_out != reference[b]).sum())
                        print(f"  note: batch {b}: {differ} of {b} tokens differ from the "
                              "first variant's")
                    reference.setdefault(b, eager_out.clone())
                    floor = (model.step_read_bytes(b) + model.kv_bytes(b)) / bw * 1e3
                    print(f"{b:>6} {eager:>9.3f} {graph_ms:>9.3f} {floor:>9.3f}")
                    rows.append(dict(variant=variant, norm=norm, batch=b, eager_ms=eager,
                                     graph_ms=graph_ms, floor_ms=floor))
                    del graph
                torch.cuda.empty_cache()
    best = {}
    for r in rows:
        if r["batch"] not in best or r["graph_ms"] < best[r["batch"]]["graph_ms"]:
            best[r["batch"]] = r
    print("\nfastest PyTorch graph per batch (ms)")
    for b in batches:
        r = best[b]
        print(f"{b:>6} {r['graph_ms']:>9.3f}  {r['variant']}, RMSNorm {r['norm']}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "torch_reference.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           model=args.model, copy_bandwidth=bw, context=args.context, rows=rows,
                           fastest_graph={str(b): best[b] for b in batches}), f, indent=1)


if __name__ == "__main__":
    main()
