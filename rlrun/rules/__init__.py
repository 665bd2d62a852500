"""Pure rules without processes or I/O: when training is done, group-relative advantages."""
