"""vLLM's general plugin entry point for rlrun (`vllm.general_plugins` in pyproject.toml): registers
rlrun's weight-transfer engine (`transfer_engine.py`) in every vLLM process. vLLM may load plugins
more than once; registering is lazy (a module path: nothing is imported until a server asks for it)."""

from __future__ import annotations

ENGINE = "rlrun"  # the backend name in --weight-transfer-config


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            ENGINE, "rlrun.inference.transfer_engine", "RlrunWeightTransferEngine"
        )
    except ValueError:  # registered already in this process
        pass
