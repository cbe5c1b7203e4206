"""LLMC names <-> torchtitan's state dict, both ways (as torchtitan's own StateDictAdapter maps HF's).

LLMC (lockstep's canonical names) -> torchtitan (`layers.{i}.` prefix):
  wte -> tok_embeddings.weight, lnfw -> norm.weight, lm_head -> lm_head.weight,
  ln1w -> attention_norm.weight, ln2w -> ffn_norm.weight,
  qkvw (rows [Q; K; V]) -> attention.qkv_linear.wq/wk/wv.weight (split by rows),
  attprojw -> attention.wo.weight,
  fcw (up) -> feed_forward.w3.weight, fcw2 (gate) -> feed_forward.w1.weight,
  fcprojw (down) -> feed_forward.w2.weight,
  Qwen3 qknormw ((2, hd): q's row, k's row) -> attention.q_norm.weight, attention.k_norm.weight.
No q/k row permutation: both families' RoPE pair layouts agree (see model.py).
"""

from __future__ import annotations

import torch

PLAIN = {"wte": "tok_embeddings.weight", "lnfw": "norm.weight", "lm_head": "lm_head.weight"}
PER_LAYER = {"ln1w": "attention_norm.weight", "ln2w": "ffn_norm.weight", "attprojw": "attention.wo.weight",
             "fcw": "feed_forward.w3.weight", "fcw2": "feed_forward.w1.weight", "fcprojw": "feed_forward.w2.weight"}
QKV = ("attention.qkv_linear.wq.weight", "attention.qkv_linear.wk.weight", "attention.qkv_linear.wv.weight")
QK_NORM = ("attention.q_norm.weight", "attention.k_norm.weight")


def qkv_rows(cfg) -> list[int]:
    return [cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]


def split_name(name: str) -> tuple[str, int | None]:
    """'qkvw[3]' -> ('qkvw', 3); 'wte' -> ('wte', None)."""
    if name.endswith("]"):
        base, _, idx = name[:-1].partition("[")
        return base, int(idx)
    return name, None


def from_llmc(tensors: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """torchtitan's state dict from LLMC-named tensors."""
    out = {}
    for name, t in tensors.items():
        base, i = split_name(name)
        if i is None:
            out[PLAIN[base]] = t
        elif base == "qkvw":
            for key, part in zip(QKV, t.split(qkv_rows(cfg), dim=0)):
                out[f"layers.{i}.{key}"] = part
        elif base == "qknormw":
            out[f"layers.{i}.{QK_NORM[0]}"], out[f"layers.{i}.{QK_NORM[1]}"] = t[0], t[1]
        else:
            out[f"layers.{i}.{PER_LAYER[base]}"] = t
    return out


def to_llmc(state: dict[str, torch.Tensor], cfg, qk_norm: bool) -> dict[str, torch.Tensor]:
    """LLMC-named tensors from torchtitan's state dict (or its gradients, keyed the same)."""
    out = {llmc: state[tt] for llmc, tt in PLAIN.items()}
    for i in range(cfg.num_layers):
        out[f"qkvw[{i}]"] = torch.cat([state[f"layers.{i}.{key}"] for key in QKV], dim=0)
        for llmc, tt in PER_LAYER.items():
            out[f"{llmc}[{i}]"] = state[f"layers.{i}.{tt}"]
        if qk_norm:
            out[f"qknormw[{i}]"] = torch.stack([state[f"layers.{i}.{key}"] for key in QK_NORM])
    return out
