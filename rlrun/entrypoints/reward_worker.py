"""A reward worker: `python -m rlrun.entrypoints.reward_worker [--environment] REF [REF ...]`,
started by the actor's worker pools (`rlrun/task/pool.py`), never by hand.

It imports the reward functions (or with --environment the environment's step functions), says
which calling convention each has (for a step: whether it may be run again after a crash), then
answers calls one at a time: a frame in (call id, function index, `GroupCall` or `StepCall`), a
frame out ("ok", rewards or the step's answer) or ("error", the traceback). Frames are a 4-byte length and a pickle, between this process and the
actor that started it only. The functions' own prints go to stderr (the actor's log), never into
the frames. It dies with the actor (PR_SET_PDEATHSIG) and ends at the end of its input.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import traceback

from rlrun.task.environment import call_step, load_step, rerun_interrupted
from rlrun.task.rewards import call_reward, convention, load_function
from rlrun.task.rows import TaskInputError

HEADER = struct.Struct(">I")


def die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the end of its input still ends it
        pass


def read_frame(stream):
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    return pickle.loads(stream.read(HEADER.unpack(header)[0]))


def write_frame(stream, value) -> None:
    data = pickle.dumps(value)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def main(args: list[str]) -> int:
    die_with_parent()
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() in a reward goes to the log, not into a frame
    frames_in = sys.stdin.buffer
    environment = args[:1] == ["--environment"]
    refs = args[1:] if environment else args
    try:
        functions = [load_step(ref) if environment else load_function(ref) for ref in refs]
    except TaskInputError as exc:
        write_frame(frames_out, ("load_error", str(exc)))
        return 2
    traits = [rerun_interrupted(f) if environment else convention(f, ref) for f, ref in zip(functions, refs)]
    write_frame(frames_out, ("ready", traits))
    run = call_step if environment else call_reward
    while (frame := read_frame(frames_in)) is not None:
        call_id, index, call = frame
        answer: tuple[str, object]
        try:
            answer = ("ok", run(functions[index], call))
        except BaseException:  # noqa: BLE001 - whatever the reward raised is the caller's to count
            answer = ("error", traceback.format_exc(limit=-8))
        write_frame(frames_out, (call_id, *answer))
    return 0


if __name__ == "__main__":
    from rlrun.telemetry import proctitle

    proctitle.name("reward")
    raise SystemExit(main(sys.argv[1:]))
