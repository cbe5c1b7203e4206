"""Step-1 capture: what one framework's first step looks like from inside.

Every runner that can look inside its framework records step 1 of a case as a `StepCapture`
(formats/step_capture.py): each module's output on rank 0's first micro batch, the gradient
arriving at each of those outputs, and every parameter's gradient of the whole step, under
canonical LLMC names. What to record is a `CaptureRequest` (request.py): full tensors for
`lockstep diagnose`, or sketches (sketch.py) for the certificate `lockstep run` gives every
FP32 pair. The runners implement it in their own packages (runners/<framework>/capture.py);
the certificate (certify/) and diagnose only read captures.
"""
