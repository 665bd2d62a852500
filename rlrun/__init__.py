"""rlrun: launcher and supervisor for asynchronous GRPO/GSPO training on math tasks."""

__version__ = "0.1.0"
