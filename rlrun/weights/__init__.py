"""The weight broadcast in Fast-LLM's wire format, shared by the trainer's sender and vLLM's transfer engine."""
