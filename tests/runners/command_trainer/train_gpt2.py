"""A GPT-2 trainer written without lockstep: plain PyTorch, reading llm.c's files itself.

The `command` runner's test trainer (toy.toml): it knows nothing of lockstep's code, only the
files (an llm.c GPT-2 checkpoint, an llm.c token file) and llm.c's printed step line. It trains
with plain SGD, micro batches read in order from the token file: window k of B*T tokens (+1 for
the targets) starts at k*B*T. `--defect` plants a known mistake for the negative controls.
"""

import argparse
import math
import sys
import time

import numpy as np
import torch

CHECKPOINT_MAGIC = 20240326
HEADER_WORDS = 256


def read_checkpoint(path):
    header = np.fromfile(path, dtype="<i4", count=HEADER_WORDS)
    if header[0] != CHECKPOINT_MAGIC or header[1] != 3:
        sys.exit(f"{path}: not an fp32 llm.c GPT-2 checkpoint")
    max_t, vocab, layers, heads, channels, padded_vocab = (int(x) for x in header[2:8])
    data = np.fromfile(path, dtype="<f4", offset=HEADER_WORDS * 4)
    L, C = layers, channels
    shapes = [("wte", (padded_vocab, C)), ("wpe", (max_t, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
              ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
              ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    params, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        params[name] = torch.tensor(data[at:at + n].reshape(shape), requires_grad=True)
        at += n
    if at != data.size:
        sys.exit(f"{path}: {data.size} floats, the header describes {at}")
    return params, dict(vocab=vocab, layers=L, heads=heads, channels=C)


def read_tokens(path):
    header = np.fromfile(path, dtype="<i4", count=HEADER_WORDS)
    count = int(header[2])
    width = (np.fromfile(path, dtype=np.uint8).size - HEADER_WORDS * 4) // max(count, 1)
    return np.fromfile(path, dtype="<u2" if width == 2 else "<u4", offset=HEADER_WORDS * 4, count=count)


def gelu(x, k):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + k * x ** 3)))


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def forward(p, shape, idx, gelu_k):
    B, T = idx.shape
    C, NH = shape["channels"], shape["heads"]
    hd = C // NH
    x = p["wte"][idx] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(shape["layers"]):
        h = layer_norm(x, p["ln1w"][i], p["ln1b"][i])
        qkv = h @ p["qkvw"][i].T + p["qkvb"][i]
        q, k, v = (t.view(B, T, NH, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][i].T + p["attprojb"][i]
        h = layer_norm(x, p["ln2w"][i], p["ln2b"][i])
        h = gelu(h @ p["fcw"][i].T + p["fcb"][i], gelu_k)
        x = x + h @ p["fcprojw"][i].T + p["fcprojb"][i]
    x = layer_norm(x, p["lnfw"], p["lnfb"])
    return x @ p["wte"][: shape["vocab"]].T  # the tied head, over the real vocabulary only


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmc", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("-B", type=int, required=True)
    ap.add_argument("-T", type=int, required=True)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--defect", choices=["none", "gelu", "window"], default="none")
    a = ap.parse_args()
    torch.manual_seed(0)
    params, shape = read_checkpoint(a.llmc)
    tokens = read_tokens(a.tokens)
    gelu_k = 0.44715 if a.defect == "gelu" else 0.044715  # the planted defect: GELU's cubic constant x10
    shift = 1 if a.defect == "window" else 0  # the planted defect: every window one token late
    n = a.B * a.T
    print(f"toy GPT-2 trainer | L={shape['layers']} C={shape['channels']} | B={a.B} T={a.T} accum={a.accum}", flush=True)
    for step in range(a.steps):
        began = time.perf_counter()
        for p in params.values():
            p.grad = None
        total = 0.0
        for micro in range(a.accum):
            start = (step * a.accum + micro) * n + shift
            buf = torch.from_numpy(tokens[start:start + n + 1].astype(np.int64))
            x, y = buf[:-1].view(a.B, a.T), buf[1:].view(a.B, a.T)
            logits = forward(params, shape, x, gelu_k)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            (loss / a.accum).backward()
            total += loss.item() / a.accum
        with torch.no_grad():
            for p in params.values():
                if p.grad is not None:
                    p -= a.lr * p.grad
        ms = (time.perf_counter() - began) * 1e3
        print(f"step {step + 1:4d}/{a.steps} | train loss {total:.6f} | lr {a.lr:.2e} | "
              f"({ms:.2f} ms | {a.accum * n / (ms / 1e3):.0f} tok/s)", flush=True)


if __name__ == "__main__":
    main()
