"""What the run's processes are built and watched with, below the backends: role files, spec parts, sockets, progress."""
