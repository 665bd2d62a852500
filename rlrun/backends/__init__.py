"""Trainer backends that run outside rlrun's own training loop.

Each backend owns what rlrun must know about one external trainer: the config it is given, the
protocol it speaks over Redis, and the checkpoint layout it writes. The hf trainer lives in
`rlrun.trainer`; the rule that says when each backend is finished lives in `rlrun.completion`.
"""
