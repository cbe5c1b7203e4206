"""lockstep: run one training case on several frameworks and compare them step by step."""

__version__ = "0.1.0"
