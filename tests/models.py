"""Real transformers models small enough for a test: built in memory in a fraction of a second."""

from __future__ import annotations


def stepped_qwen2():
    """A ~130 KB Qwen2 (untied, 32 tokens) and its AdamW, after one optimizer step, so the optimizer
    has state to save: (model, optimizer)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return model, optimizer
