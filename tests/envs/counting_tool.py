"""An environment for the tests: every model turn is a call of a tool that counts its calls.

Each call appends "start <group> <sample> <turn>" to the file $RLRUN_TOOL_LOG before it runs and
"done ..." after, so a test can tell a step that ran twice from one a crash cut (a start with no
done). The tool answers with the sum of the first turn's digits; after `TURNS` turns the
conversation is done, rewarded 1 when the first turn was the right sum. Steps of turn 2 sleep
$RLRUN_TOOL_SLEEP seconds, so that conversations wait with a finished tool call behind them.
"""

import os
import time


TURNS = 3


def _log(kind: str, info) -> None:
    with open(os.environ["RLRUN_TOOL_LOG"], "a") as handle:
        handle.write(f"{kind} {info.group_id} {info.index} {info.turn}\n")


def step(messages, row, info):
    _log("start", info)
    if info.turn == 2:
        time.sleep(float(os.environ.get("RLRUN_TOOL_SLEEP", "0")))
    first = messages[1]["content"].strip()
    if info.turn >= TURNS or info.last:
        answer = {"done": True, "reward": float(first == str(row["answer"]))}
    else:
        answer = {"observation": f" {sum(int(c) for c in first if c.isdigit())}=", "role": "tool"}
    _log("done", info)
    return answer
