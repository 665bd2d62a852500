"""The command line and what it shows: the commands, their tables, the live view, status, plots."""
