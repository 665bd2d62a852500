"""`python -m rlrun.entrypoints.config_reference > docs/config-reference.md`: writes the
configuration reference (rlrun/config/reference.py) to stdout.
"""

from __future__ import annotations

if __name__ == "__main__":
    from rlrun.config.reference import render

    print(render(), end="")
