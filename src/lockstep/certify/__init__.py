"""The step-1 certificate: two frameworks' captures of step 1 compared tensor by tensor, and
what their differences mean.

tensors.py measures (whole tensors, or sketches of them: relative error and cosine per tensor,
in forward order, in backward order, per micro batch); classify.py turns the measurements into
findings (the first diverging module, a lost tie, a wrong input gradient of a backward, a
gradient kernel, micro batches paired with the wrong data); certificate.py is the verdict
`lockstep run` attaches to every FP32 pair, and `lockstep diagnose` builds its fuller verdict on
the same findings.
"""
