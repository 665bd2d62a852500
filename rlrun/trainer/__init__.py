"""The hf trainer: GRPO/GSPO losses, the optimizer loop, checkpoints, weight sync to vLLM.

Knows nothing about the actor beyond the group messages it consumes from Redis.
"""
