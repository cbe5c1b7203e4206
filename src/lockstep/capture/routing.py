"""What a capture records of a mixture-of-experts layer's router (formats/step_capture.py `routing`):
every runner names it the same way, so that the certificate can say which tokens went elsewhere.

The router logits are a module output like any other (`router[l]`, (B, T, E)); the decisions
taken from them are kept whole beside the tensors: `experts[l]` and `weights[l]` (B, T, k), and
`aux_loss[l]`, the layer's load-balancing loss of the micro batch at coefficient 1.
"""

from __future__ import annotations

import numpy as np

ROUTER = "router"  # module output name of the router logits: router[l]


def experts_name(layer: int) -> str:
    return f"experts[{layer}]"


def weights_name(layer: int) -> str:
    return f"weights[{layer}]"


def aux_loss_name(layer: int) -> str:
    return f"aux_loss[{layer}]"


def ranked_experts(logits, chosen, topk: int):
    """The k chosen experts of each token (`chosen`: a boolean map over the experts, as megatron-core's
    routing_map), highest logit first and an equal logit at the lower index first."""
    import torch

    masked = torch.where(chosen, logits.float(), torch.full_like(logits, float("-inf"), dtype=torch.float32))
    return torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :topk]


def add_routing(builder, layer: int, experts, weights, aux_loss) -> None:
    """One layer's router decisions on micro batch 0, (B, T, k) each (the forward's rows kept), and its
    load-balancing loss of the whole micro batch."""
    def host(t) -> np.ndarray:
        return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

    routing = builder.capture.routing
    routing[experts_name(layer)] = host(builder.rows_of(experts)).astype(np.int16)
    routing[weights_name(layer)] = host(builder.rows_of(weights)).astype(np.float32)
    routing[aux_loss_name(layer)] = np.asarray(float(aux_loss), dtype=np.float64)
