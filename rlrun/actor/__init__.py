"""The actor: prompts, group sampling through vLLM, rewards, advantages, publishing groups.
Knows nothing about trainer internals (what it needs is `trainer_view.py`).
"""
