"""The Fast-LLM config rlrun generates, the command that launches it, and the config checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from rlrun.backends.fast_llm.config import (
    broadcast_backend,
    checkpoint_format,
    docs_per_step,
    fast_llm_config,
    launch_argv,
    micro_batches_per_step,
    write_config,
)
from rlrun.backends.fast_llm.revisions import REVISIONS, named
from rlrun.config import compose
from rlrun.run.preflight import check_settings
from rlrun.run.built import build
from tests.refusals import refusal, settings_refusal

GOLDEN = Path(__file__).parent.parent / "golden"
FIXED = dict(
    redis_host="127.0.0.1",
    redis_port=6390,
    experiment_dir=Path("/runs/golden/fast_llm"),
    model_path="/models/tiny",
    broadcast_host="127.0.0.1",
    broadcast_port=29555,
)


GSPO, MAIN = named("gspo"), named("main")
# FIXED's model folder does not exist: name the converter (auto would read its config.json)
QWEN2 = "trainer.fast_llm.checkpoint_format=qwen2"


@pytest.mark.parametrize("revision", [r.name for r in REVISIONS])
@pytest.mark.parametrize("recipe", ["math_gspo", "math_grpo"])
def test_generated_config_matches_golden_file(recipe, revision, tmp_path):
    """Each golden file was accepted by the real Fast-LLM of its revision (its header says which
    commit; `fast-llm train gpt --config FILE -v` with pretrained.path at the tiny model, on CPU)."""
    cfg, _ = compose([f"recipe={recipe}", "trainer=fast_llm", QWEN2, "trainer.device=cpu"])
    path = write_config(cfg, named(revision), tmp_path / "fast_llm.yaml", **FIXED)
    golden = GOLDEN / f"fast_llm_{recipe}_{revision}.yaml"
    if os.environ.get("RLRUN_UPDATE_GOLDEN"):
        golden.write_text(path.read_text())
    assert yaml.safe_load(path.read_text()) == yaml.safe_load(golden.read_text())


def test_revisions_differ_only_in_docs_per_step():
    cfg, _ = compose(["trainer=fast_llm", QWEN2, "trainer.train_batch_size=64"])
    rl, main = fast_llm_config(cfg, GSPO, **FIXED), fast_llm_config(cfg, MAIN, **FIXED)
    assert rl.pop("schedule") == {"docs_per_step": 64, "depth_first_micro_batches": 64} and "schedule" not in main
    assert rl == main


@pytest.mark.parametrize(
    "overrides, docs, micro_batches",
    [
        ([], 256, 256),  # one rank: a micro-batch may hold a single document
        (["trainer.fast_llm.docs_per_step=100", "trainer.fast_llm.nproc_per_node=3"], 100, 34),  # 3 ranks: ceil(100 / 3)
        (["trainer.fast_llm.docs_per_step=8", "trainer.fast_llm.data_parallel=8"], 8, 1),
    ],
)
def test_the_data_sampler_holds_the_micro_batches_every_step_may_need(overrides, docs, micro_batches):
    """Fast-LLM's RL branches size their sampler as train_iters x depth_first_micro_batches micro-batches
    per rank; at the default 1, steps of several micro-batches spent it and Fast-LLM died with
    StopIteration in its first step (SmolLM2: 8 documents per step in 128-token micro-batches)."""
    cfg, _ = compose(["trainer=fast_llm", QWEN2, *overrides])
    assert fast_llm_config(cfg, GSPO, **FIXED)["schedule"] == {"docs_per_step": docs, "depth_first_micro_batches": micro_batches}
    assert micro_batches_per_step(cfg) == micro_batches


def test_cpu_keys_and_a_single_streaming_loader():
    cpu, _ = compose(["trainer=fast_llm", QWEN2, "trainer.device=cpu"])
    gpu, _ = compose(["trainer=fast_llm", QWEN2, "trainer.device=cuda"])
    on_cpu, on_gpu = fast_llm_config(cpu, MAIN, **FIXED), fast_llm_config(gpu, MAIN, **FIXED)
    assert on_cpu["model"]["distributed"] == {"compute_dtype": "fp32", "use_cuda": False, "backend": "gloo"}
    assert on_cpu["data"]["gpu"] is False
    assert on_gpu["model"]["distributed"] == {"compute_dtype": "fp32"} and "gpu" not in on_gpu["data"]
    # the streaming dataset refuses a second loader per rank: no worker processes, ever
    assert on_cpu["training"]["num_workers"] == on_gpu["training"]["num_workers"] == 0


def test_generated_config_follows_the_run_config():
    cfg, _ = compose(
        ["recipe=math_grpo", "trainer=fast_llm", QWEN2, "trainer.max_train_steps=40", "trainer.train_batch_size=64",
         "trainer.checkpoint_every=10", "inference.num_servers=3", "trainer.lr=1e-5"]
    )
    out = fast_llm_config(cfg, GSPO, **FIXED)
    assert out["training"]["train_iters"] == 40
    assert out["training"]["checkpoint"]["interval"] == 10
    assert out["schedule"]["docs_per_step"] == 64 == docs_per_step(cfg)
    assert out["data"]["datasets"]["training"] == {"type": "streaming", "host": "127.0.0.1", "port": 6390, "timeout": 600.0}
    streaming = out["callbacks"]["streaming"]
    assert (streaming["host"], streaming["port"]) == ("127.0.0.1", 6390)
    assert "password" not in yaml.safe_dump(out)
    assert streaming["broadcast"] == {"host": "127.0.0.1", "port": 29555, "backend": "nccl", "external_world_size": 3}
    hot, _ = compose(["recipe=math_grpo", "trainer=fast_llm", QWEN2, "actor.temperature=0.5"])
    assert fast_llm_config(hot, GSPO, **FIXED)["model"]["base_model"]["head"]["losses"]["grpo"]["logits_scale_factor"] == 2.0
    loss = out["model"]["base_model"]["head"]["losses"]["grpo"]
    assert loss == {"type": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.28, "logits_scale_factor": 1.0, "metrics": "none"}
    assert out["optimizer"]["learning_rate"]["base"] == 1e-5
    assert out["pretrained"]["path"] == "/models/tiny"
    assert out["run"]["experiment_dir"] == "/runs/golden/fast_llm"


def test_explicit_docs_per_step_backend_and_extra_keys():
    cfg, _ = compose(
        ["trainer=fast_llm", QWEN2, "trainer.fast_llm.docs_per_step=100", "trainer.device=cpu",
         "+trainer.fast_llm.extra.training.logs.interval=1", "+trainer.fast_llm.extra.data.micro_batch_size=128"]
    )
    out = fast_llm_config(cfg, GSPO, **FIXED)
    assert out["schedule"]["docs_per_step"] == 100
    assert broadcast_backend(cfg.trainer) == "gloo" == out["callbacks"]["streaming"]["broadcast"]["backend"]
    assert out["training"]["logs"] == {"interval": 1}
    assert out["training"]["train_iters"] == cfg.trainer.max_train_steps  # merged, not replaced
    assert out["data"]["micro_batch_size"] == 128 and out["data"]["datasets"]["training"]["type"] == "streaming"


def _model_folder(tmp_path: Path, config: str) -> Path:
    (tmp_path / "config.json").write_text(config)
    return tmp_path


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_auto_checkpoint_format_is_the_model_folders_model_type(model_type, tmp_path):
    """SmolLM2 is a Llama and the tiny model a Qwen2: Fast-LLM's Qwen2 importer refuses a Llama
    folder (`['LlamaForCausalLM'] != ['Qwen2ForCausalLM']`), and the broadcast exports with the
    same converter, so both keys follow the folder."""
    folder = _model_folder(tmp_path, json.dumps({"model_type": model_type, "architectures": ["X"]}))
    cfg, _ = compose(["trainer=fast_llm", "trainer.device=cpu"])
    assert cfg.trainer.fast_llm.checkpoint_format == "auto"
    out = fast_llm_config(cfg, GSPO, **{**FIXED, "model_path": str(folder)})
    assert out["pretrained"]["format"] == out["callbacks"]["streaming"]["export"]["format"] == model_type


def test_an_explicit_checkpoint_format_wins_over_the_folder(tmp_path):
    folder = _model_folder(tmp_path, json.dumps({"model_type": "llama"}))
    cfg, _ = compose(["trainer=fast_llm", "trainer.fast_llm.checkpoint_format=mistral"])
    assert checkpoint_format(cfg, folder) == "mistral"


@pytest.mark.parametrize(
    "config, expected",
    [
        (None, ["could not be read", "config.json", "trainer.fast_llm.checkpoint_format"]),
        ("{not json", ["could not be read", "trainer.fast_llm.checkpoint_format"]),
        ('{"model_type": "gpt2"}', ["model_type 'gpt2'", "llama, qwen2", "trainer.fast_llm.checkpoint_format"]),
        ("{}", ["model_type None", "trainer.fast_llm.checkpoint_format"]),
    ],
)
def test_auto_checkpoint_format_refuses_a_folder_it_cannot_read(config, expected, tmp_path):
    folder = tmp_path if config is None else _model_folder(tmp_path, config)
    cfg, _ = compose(["trainer=fast_llm"])
    refusal(lambda: checkpoint_format(cfg, folder), *expected)


def test_launch_argv_fills_the_command_template(tmp_path):
    cfg, _ = compose(["trainer=fast_llm", "trainer.fast_llm.nproc_per_node=4"])
    assert launch_argv(cfg, tmp_path / "f.yaml") == [
        "torchrun", "--nproc_per_node=4", "--no_python", "fast-llm", "train", "gpt", "--config", str(tmp_path / "f.yaml"),
    ]
    cfg, _ = compose(
        ["trainer=fast_llm", "trainer.fast_llm.data_parallel=3",
         "trainer.fast_llm.command=[python,tests/fast_llm_standin.py,--config,'{config}',--data-parallel,'{data_parallel}']"]
    )
    assert launch_argv(cfg, Path("/x.yaml")) == ["python", "tests/fast_llm_standin.py", "--config", "/x.yaml", "--data-parallel", "3"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer=fast_llm", "trainer.fast_llm.docs_per_step=0"], ["trainer.fast_llm.docs_per_step must be at least 1"]),
        (["trainer=fast_llm", 'inference.extra_args=["--tensor-parallel-size","2"]'], ["one vLLM worker per server"]),
        (["trainer=fast_llm", 'inference.extra_args=["--pipeline-parallel-size=2"]'], ["inference.num_servers"]),
    ],
)
def test_inconsistent_fast_llm_config_is_refused_before_anything_starts(overrides, expected):
    refusal(lambda: compose(overrides), *expected)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.gradient_accumulation_passes=4"],
         ["trainer.gradient_accumulation_passes=4", "Fast-LLM ignores it", "trainer.fast_llm.docs_per_step=1024"]),
        (["trainer.fast_llm.micro_batch_size=16"], ["trainer.fast_llm.micro_batch_size", "model.max_model_len"]),
        (["trainer.fast_llm.command=[fast-llm,train]"], ["{config}"]),
        (["trainer.fast_llm.version=jlp"], ["trainer.fast_llm.version=jlp", "auto", "gspo, main"]),
        (["trainer.fast_llm.events_stream=fast_llm_streaming"], ["two different"]),
        (["trainer.fast_llm.experiment_dir_name=a/b"], ["trainer.fast_llm.experiment_dir_name must be a plain folder name", "'a/b'"]),
        (["trainer.max_train_steps=400", "trainer.fast_llm.train_iters=393"],
         ["trainer.fast_llm.train_iters (393)", "trainer.max_train_steps (400)"]),
        (["actor.num_actors=2", "inference.num_servers=2", "trainer.device=cpu"], ["actor.num_actors=2 needs trainer=hf"]),
        (["streams.url=redis://10.0.0.5:6379/0", "trainer.device=cpu"], ["needs the run's own Redis"]),
    ],
)
def test_fast_llm_settings_its_backend_refuses_are_refused_by_preflight_before_anything_else(overrides, expected):
    """Fast-LLM's own rules (its revisions, its micro-batches, its command) are its backend's, asked
    first by preflight: the same one-paragraph ConfigError as config validation's (`rlrun train`
    says it whole: tests/integration/test_bad_input.py)."""
    assert settings_refusal(["trainer=fast_llm", *overrides], *expected).startswith("invalid configuration: ")
    check_settings(build(compose(["trainer=fast_llm"])[0]))  # the shipped settings pass


def test_agreeing_train_iters_and_hf_accumulation_are_accepted():
    cfg, _ = compose(["trainer=fast_llm", "trainer.max_train_steps=7", "trainer.fast_llm.train_iters=7"])
    assert cfg.trainer.fast_llm.train_iters == 7
    cfg, _ = compose(["trainer.gradient_accumulation_passes=4"])  # the hf trainer uses it
    assert cfg.trainer.backend == "hf" and cfg.trainer.samples_per_step == 1024
    check_settings(build(cfg))
    compose(["trainer=fast_llm", 'inference.extra_args=["--tensor-parallel-size=1"]'])  # one worker per server: fine
    compose(['inference.extra_args=["--tensor-parallel-size","2"]'])  # hf reloads from disk: any layout
