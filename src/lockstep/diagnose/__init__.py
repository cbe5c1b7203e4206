"""`lockstep diagnose`: where two frameworks first part on step 1 of a case, and what kind of defect it is.

capture (StepCapture, .npz) · reference_capture (pytorch) · megatron_capture (the worker's step-1
entry) · weights_only (InfiniTrain: gradients from one saved SGD step) · frameworks (which of
those per framework) · compare (tensor metrics) · classify (findings) · verdict · run (plan,
drift, files) · render (terminal and the HTML report's section).
"""
