"""What a run records: per-step metrics, ETTR, W&B, stack dumps and process titles."""
