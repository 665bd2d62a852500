"""The actor: prompts, group sampling through vLLM, rewards, advantages, publishing groups.

Knows nothing about trainer internals: it reads the trainer's published step and policy version
from Redis and writes finished groups to the trainer's stream.
"""
