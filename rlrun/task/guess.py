"""The bundled task of several turns: guess the number (dataset=guess, recipe=smollm2_guess).

Each row hides a whole number from 1 to `high`; the model guesses, the environment answers
"Higher." or "Lower." (or asks for a number), until it guesses right or its turns run out. The
reward says how soon: 1 on the first turn, a quarter less for every turn after it, 0 when it never
guesses right; plus up to FORMAT_BONUS for the share of its replies that are a number and nothing
else (a pretrained 135M model mostly answers in words at first: without it, wins are too rare to
learn from in a short run). Binary search wins every game of 1..8 in at most 4 turns; a model that
ignores the answers wins 1 in 8 at each turn.
"""

from __future__ import annotations

import random
import re

# Chosen by measurement on SmolLM2-135M-Instruct (32 samples of 8 tokens each): a number in 1..8
# in 13 of 32 first replies; the longer wording this replaced got 2 of 32 (bench/README.md).
PROMPT = "Guess my number from 1 to {high}. I will say higher or lower. Reply with one number only."
PENALTY_PER_TURN = 0.25
FORMAT_BONUS = 0.25
NUMBER = re.compile(r"-?\d+")
ONLY_A_NUMBER = re.compile(r"\s*-?\d+\s*\.?\s*")


def guess_rows(high: int, num_problems: int, seed: int) -> list[dict]:
    """The task's rows: {"prompt", "target", "high"}, targets drawn with `seed`."""
    if high < 2:
        raise ValueError(f"a guessing game needs at least two numbers (dataset.max_operand={high})")
    draw = random.Random(seed)
    return [
        {"prompt": PROMPT.format(high=high), "target": draw.randint(1, high), "high": high} for _ in range(num_problems)
    ]


def step(messages: list[dict], row: dict, info) -> dict:
    """The environment's answer to the model's last guess (its first whole number)."""
    found = NUMBER.search(messages[-1]["content"])
    guess = int(found.group()) if found else None
    if guess == row["target"]:
        return {"done": True, "reward": max(0.0, 1.0 - PENALTY_PER_TURN * (info.turn - 1)) + format_bonus(messages)}
    if info.last:
        return {"done": True, "reward": format_bonus(messages)}
    if guess is None:
        return {"observation": f"Reply with one whole number from 1 to {row['high']}.", "role": "user"}
    return {"observation": "Higher." if row["target"] > guess else "Lower.", "role": "user"}


def format_bonus(messages: list[dict]) -> float:
    """FORMAT_BONUS times the share of the model's replies that are a number and nothing else."""
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    return FORMAT_BONUS * sum(1 for r in replies if ONLY_A_NUMBER.fullmatch(r)) / max(1, len(replies))
