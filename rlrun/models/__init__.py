"""Models rlrun can build itself (the tiny demo model); real models come from a path or the hub."""
