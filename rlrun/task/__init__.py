"""Task datasets: prompts, reference answers and the rewards that check them (no torch here)."""
