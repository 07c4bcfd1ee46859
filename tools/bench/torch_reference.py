#!/usr/bin/env python3
"""PyTorch reference for kiln's decode step: the 1B-class Llama shape, eager and CUDA graph.

    python3 tools/bench/torch_reference.py [--batches 1,8,32,128] [--context 1024] [--norms hf,fused]

The model: hidden 2048, 16 layers, 32/8 heads of 64, ffn 8192, vocab 128256, tied embeddings,
random bf16 weights. Written the way a Hugging Face Llama runs (RMSNorm in float32 as
transformers writes it, or PyTorch's fused F.rms_norm; fused projections, rotate-half RoPE
from a float32 cos/sin table, F.scaled_dot_product_attention with grouped-query attention) over a plain, non-paged KV cache of `context` positions per sequence
that starts full of random values: each decode step writes the new K/V at position context - 1
and attends over all `context` positions. The step ends with the logits and a greedy argmax.

Times one decode step per batch size with CUDA events after warm-up and prints medians: eager,
and replaying one torch.cuda.CUDAGraph of the step (inputs in static tensors). The floor column
is weights + KV cache bytes read once at the measured device-to-device copy bandwidth.
Writes the table as JSON to $OUT/torch_reference.json when $OUT is set.
"""
import argparse
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2048, 16, 32, 8, 64, 8192, 128256
ROPE_THETA, RMS_EPS = 500000.0, 1e-5


def rms_norm_hf(x, weight):
    # As transformers' LlamaRMSNorm: normalise in float32, scale in the activation dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return weight * xf.to(x.dtype)


def rms_norm_fused(x, weight):
    # PyTorch's own RMSNorm: one fused kernel instead of the six above.
    return F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    def __init__(self, max_batch, context, device, rms_norm):
        self.rms_norm = rms_norm
        g = torch.Generator(device=device).manual_seed(0)
        bf = torch.bfloat16

        def uniform(*shape, scale):
            return ((torch.rand(*shape, generator=g, device=device) * 2 - 1) * scale).to(bf)

        qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        self.embed = uniform(VOCAB, HIDDEN, scale=math.sqrt(3))  # tied with the LM head
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(dict(
                ln1=1 + uniform(HIDDEN, scale=0.25),
                wqkv=uniform(qkv_rows, HIDDEN, scale=math.sqrt(3 / HIDDEN)),
                wo=uniform(HIDDEN, HEADS * HEAD_DIM, scale=math.sqrt(3 / (HEADS * HEAD_DIM))),
                ln2=1 + uniform(HIDDEN, scale=0.25),
                wgu=uniform(2 * FFN, HIDDEN, scale=math.sqrt(3 / HIDDEN)),
                wdown=uniform(HIDDEN, FFN, scale=math.sqrt(3 / FFN)),
            ))
        self.norm = 1 + uniform(HIDDEN, scale=0.25)
        cache_shape = (LAYERS, max_batch, KV_HEADS, context, HEAD_DIM)
        self.k_cache = uniform(*cache_shape, scale=1.0)
        self.v_cache = uniform(*cache_shape, scale=1.0)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(context, device=device).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(bf), emb.sin().to(bf)  # [context, head_dim]
        self.context = context

    def weight_bytes(self):
        n = self.embed.numel() + self.norm.numel()
        for layer in self.layers:
            n += sum(t.numel() for t in layer.values())
        return 2 * n

    def kv_bytes(self, batch):
        return 2 * LAYERS * batch * KV_HEADS * self.context * HEAD_DIM * 2

    def step(self, tokens, pos):
        """tokens: int64 [B]; pos: int64 [1], the position every sequence writes. Returns [B]."""
        b = tokens.shape[0]
        x = self.embed[tokens]  # [B, H]
        cos = self.cos[pos].view(1, 1, HEAD_DIM)
        sin = self.sin[pos].view(1, 1, HEAD_DIM)
        for l, w in enumerate(self.layers):
            h = self.rms_norm(x, w["ln1"])
            qkv = h @ w["wqkv"].t()
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
            q = q.view(b, HEADS, HEAD_DIM)
            k = k.view(b, KV_HEADS, HEAD_DIM)
            v = v.view(b, KV_HEADS, HEAD_DIM)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            kc, vc = self.k_cache[l, :b], self.v_cache[l, :b]  # [B, KV, T, D]
            kc.index_copy_(2, pos, k.unsqueeze(2))
            vc.index_copy_(2, pos, v.unsqueeze(2))
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, enable_gqa=True)
            x = x + o.reshape(b, HEADS * HEAD_DIM) @ w["wo"].t()
            h = self.rms_norm(x, w["ln2"])
            gate, up = (h @ w["wgu"].t()).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["wdown"].t()
        logits = self.rms_norm(x, self.norm) @ self.embed.t()
        return logits.argmax(dim=-1)


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--norms", default="hf,fused",
                        help="RMSNorm variants: hf (transformers' six-op form), fused (F.rms_norm)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    norms = {"hf": rms_norm_hf, "fused": rms_norm_fused}
    for norm in args.norms.split(","):
        model = Llama(max(batches), args.context, device, norms[norm])
        print(f"1B-class Llama decode step, RMSNorm {norm}, context {args.context}, "
              f"{model.weight_bytes() / 2**30:.2f} GiB of weights (ms, median of {args.reps})")
        print(f"{'batch':>6} {'eager':>9} {'graph':>9} {'floor':>9}")
        with torch.inference_mode():
            for b in batches:
                tokens = torch.randint(0, VOCAB, (b,), device=device)
                pos = torch.tensor([args.context - 1], device=device)
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
                # The graph computes what eager does (reported, not fatal: cuBLAS may pick
                # other kernels under capture).
                torch.cuda.synchronize()
                if not torch.equal(out, model.step(tokens, pos)):
                    print(f"  note: batch {b}: graph replay tokens differ from eager")
                floor = (model.weight_bytes() + model.kv_bytes(b)) / bw * 1e3
                print(f"{b:>6} {eager:>9.3f} {graph_ms:>9.3f} {floor:>9.3f}")
                rows.append(dict(norm=norm, batch=b, eager_ms=eager, graph_ms=graph_ms,
                                 floor_ms=floor))
                del graph
        del model
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "torch_reference.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           copy_bandwidth=bw, context=args.context, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
