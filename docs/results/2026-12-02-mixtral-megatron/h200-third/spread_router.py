"""Write mixtral-l32-c512's seeded init with every router spread to N(0, 0.5), as the CPU test does, so
that tokens choose their experts decisively (the init's 0.02 router routes nearly uniformly: near ties)."""
import sys
import numpy as np
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.init import init_tensors

config = SHAPES[sys.argv[1]].config
family = FAMILIES["mixtral"]
tensors = {k: np.array(v) for k, v in init_tensors(config, family.init_rule(config), 42).items()}
rng = np.random.default_rng(7)
for layer in range(config.num_layers):
    name = f"routerw[{layer}]"
    tensors[name] = rng.normal(0.0, 0.5, tensors[name].shape).astype(np.float32)
family.write(sys.argv[2], config, tensors)
print("wrote", sys.argv[2])
