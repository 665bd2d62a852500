"""The per-sample token journal: append, read back, replay plan, exactly-once delivery marks.

The actor appends every sample's tokens, their sampled-token logprobs and the policy version
that produced them to the journal in Redis as they stream in (`store.py`); a group is published
to the trainer's stream and marked delivered in one atomic step. After any restart the open
groups are read back and `plan.plan_replay` (pure) says which samples to keep, continue from
their exact prefix, or restart (the actor's `rlrun.actor.replay.resume` makes its groups of that
plan). This package knows nothing about HTTP or vLLM.
"""
