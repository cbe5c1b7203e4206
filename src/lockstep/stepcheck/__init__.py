"""Looking inside one step of a (baseline, test) pair, from one start state.

Every way lockstep looks inside a step goes through here: `lockstep run`'s step-1 certificates
(certificates.py), a resumed case's certificate (the step after its resume point, both sides from
the reference's saved state), `lockstep diagnose` and `diagnose --at-step N` (diagnose/ calls
these), and `lockstep bisect` (it judges each commit through the run pipeline).

- request.py: the one builder of what a runner records (a CaptureRequest), and the one place the
  optimizer's constants a capture needs (Adam's eps) are derived.
- state.py: the state a step starts from: the initial weights, the reference's state after step
  N (made here by the reference), or the state a saving case left; checked, noted, removed.
- judge.py: two captures compared, and the close-call rule once: when the findings part by only
  a little, the reference's step 1 in FP64 is made (at most once per case) and the pair judged
  again with its rounding allowance, reusing the tensor differences already computed.

The reference's part of all this (FP64 steps, its saved states, their canonical tensors) is asked
of it through its declared services (runners/reference.py), never by importing its modules.
"""
