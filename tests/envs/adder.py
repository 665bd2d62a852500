"""An environment for the tests: the model may call one tool, add(a, b), written in the
`<tool_call>{json}</tool_call>` format; a turn cut short is asked to finish; an answer ends the
conversation, rewarded 1 when its last number is the row's answer (a wrong first answer gets a
second try).

Each call appends what it was shown (its sample, turn, how the turn ended, the messages) as a JSON
line to the file $RLRUN_ADDER_LOG, so that a test can check the conversation the environment saw
and that no step ran twice.
"""

import json
import os
import re

TOOLS = {"add": lambda a, b: a + b}


def step(messages, row, info):
    seen = {"index": info.index, "turn": info.turn, "finish_reason": info.finish_reason, "messages": messages}
    with open(os.environ["RLRUN_ADDER_LOG"], "a") as handle:
        handle.write(json.dumps(seen) + "\n")
    turn = messages[-1]
    if turn.get("tool_calls"):
        call = turn["tool_calls"][0]
        return {"observation": str(TOOLS[call["name"]](**call["arguments"])), "role": "tool", "name": call["name"]}
    if info.finish_reason == "length" and not info.last:
        return {"observation": "finish your answer", "role": "user"}
    right = re.findall(r"-?\d+", turn["content"])[-1:] == [str(row["answer"])]
    if right or info.turn > 1 or info.last:
        return {"done": True, "reward": float(right)}
    return {"observation": "wrong, try again", "role": "user"}
