"""Where a process runs: a local subprocess (world=local, the default) or a node of an existing
Ray cluster (world=ray). The supervisor takes a spawner; `world.spawner_for` picks it from the
config.

Knows where processes run, not what they do. Ray is imported only for world=ray.
"""
