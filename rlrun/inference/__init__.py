"""vLLM: the server's command line and health probe, the trainer's weight-update calls on vLLM's
own HTTP routes, and rlrun's weight-transfer engine (the only code here that runs inside vLLM,
registered through vLLM's plugin entry point).
"""
