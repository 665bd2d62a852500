"""Configuration: Hydra composition, the typed schema, validation, the saved resolved config.

Owns turning `conf/` plus overrides into one frozen `RunConfig`. Knows nothing about processes
or Redis; a `DictConfig` never leaves this package.
"""

from rlrun.config.compose import compose, load_resolved
from rlrun.config.schema import RunConfig

__all__ = ["RunConfig", "compose", "load_resolved"]
