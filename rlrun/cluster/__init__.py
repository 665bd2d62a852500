"""Where a process runs: a local subprocess (world=local) or a node of an existing Ray cluster
(world=ray); `world.World.spawner` picks the spawner. Knows where processes run, not what they do.
"""
