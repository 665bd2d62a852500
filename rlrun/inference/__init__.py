"""vLLM: the server's command line and health probe, the actor's streaming client, and the
trainer's weight-update calls. Uses vLLM's own HTTP endpoints only; never imports vllm.
"""
