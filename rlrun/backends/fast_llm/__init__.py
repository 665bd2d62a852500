"""The Fast-LLM trainer backend (ServiceNow/Fast-LLM, launched as `fast-llm train gpt`).

Everything rlrun needs to know about Fast-LLM, behind `rlrun.backends.TrainerBackend` (`backend`);
docs/architecture.md lists the modules and what each follows in Fast-LLM's sources. It knows
nothing of the hf trainer and starts no process: the supervisor does, from the specs `backend`
returns. The completion rule is `rlrun.completion.fast_llm_finished`.
"""
