"""File formats: LLMC checkpoints (llmc.py; each family's header in models/<family>/checkpoint.py),
llm.c token streams, run records and log lines. `detect.py` says which format a file is in."""
