"""Where a process runs: a local subprocess (world=local), a node of an existing Ray cluster
(world=ray) or an srun step of a SLURM job (world=slurm); `world.World.spawner` picks the spawner.
Knows where processes run, not what they do.
"""
