"""The small saving case and the case that resumes it (gpt2, 4 SGD steps at lr 0.1, saved at step 2, resumed
from it), as a matrix: the resume tests of the pipeline and of InfiniTrain's runner train the same pair."""

RESUME_MATRIX = """
[defaults]
model = "gpt2"
dtype = "float32"
micro_batch = 4
seq_len = 64
total_batch = 256
steps = 4
lr = 0.1

[[case]]
name = "saving"
checkpoint = { save_interval = 2 }

[[case]]
name = "resumed"
checkpoint = { resume_from = 2, resume_case = "saving" }
"""
