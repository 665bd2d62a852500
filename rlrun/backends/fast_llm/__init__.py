"""The Fast-LLM trainer backend (ServiceNow/Fast-LLM, `fast-llm train gpt`) behind
`rlrun.backends.TrainerBackend` (`backend`). Knows nothing of the hf trainer and starts no process;
docs/architecture.md lists the modules and what each follows in Fast-LLM's sources.
"""
