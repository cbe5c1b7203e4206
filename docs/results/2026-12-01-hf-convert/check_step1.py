"""After `lockstep convert` and `lockstep run` (README.md here): the converted file in lockstep's
reference against transformers on gpt2_1's first batch (B=4, T=64, the first 257 tokens of the
train split): max |logits difference| and both losses, to set beside the run's step-1 loss."""

import numpy as np
import torch
import transformers

from lockstep.formats.tokens import read_token_stream
from lockstep.models import FAMILIES, load_checkpoint

transformers.logging.set_verbosity_error()
hf = transformers.GPT2LMHeadModel.from_pretrained("hf_gpt2_124m_random", attn_implementation="eager").eval()
tok = np.asarray(read_token_stream("cache/prepared/tiny_shakespeare_train.bin").tokens[:257], dtype=np.int64)
x, y = torch.from_numpy(tok[:-1].reshape(4, 64)), torch.from_numpy(tok[1:].reshape(4, 64))
ck = load_checkpoint("gpt2_124M_from_hf.bin")
ref = FAMILIES["gpt2"].reference_class().from_llmc(ck.tensors, ck.config).eval()
with torch.no_grad():
    a = hf(x).logits
    b, _ = ref(x)
print("max |logits diff|", (a - b).abs().max().item(), "max |logit|", a.abs().max().item())
print("transformers loss on gpt2_1's first batch", torch.nn.functional.cross_entropy(a.double().view(-1, 50257), y.view(-1)).item())
print("reference loss", torch.nn.functional.cross_entropy(b.double().view(-1, 50257), y.view(-1)).item())
