"""The Fast-LLM trainer backend (ServiceNow/Fast-LLM, launched as `fast-llm train gpt`).

This package owns everything rlrun needs to know about Fast-LLM and nothing else:

- `config`: generating Fast-LLM's own YAML config from the run's `RunConfig` and its launch argv;
- `protocol`: its Redis protocol, i.e. the document messages the actor writes to
  `fast_llm_streaming` and the events Fast-LLM writes to `fast_llm_events` (these are Fast-LLM's
  messages, not rlrun's: no schema_version);
- `checkpoints`: its checkpoint layout (`<experiment_dir>/checkpoint/<step>/`, `ok` written last)
  and moving half-written checkpoints aside before a (re)start;
- `acl`: the Redis ACL that lets Fast-LLM's passwordless clients touch its streams and nothing else;
- `backend`: all of it behind `rlrun.backends.TrainerBackend` (process specs, completion check,
  checkpoint layout, ports); `view`: what the actor needs to know about Fast-LLM.

It knows nothing of the hf trainer (`rlrun.trainer`), and it starts no process: the supervisor does
that with the specs `backend` returns. The completion rule is
`rlrun.completion.fast_llm_finished`.
"""
