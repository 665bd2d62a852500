"""`--dry-run`: the run's plan (`rlrun.run.plan.RunPlan`) rendered; it decides nothing."""

from __future__ import annotations

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from rlrun.run.plan import RunPlan


def print_dry_run(console: Console, plan: RunPlan, resolved: str) -> None:
    cfg = plan.built.cfg
    console.print(Syntax(resolved, "yaml", theme="ansi_dark", background_color="default"))
    table = Table(title=f"processes rlrun would start (run directory {plan.run_dir.root})")
    for column in ("name", "command", "notable env", "log"):
        table.add_column(column, overflow="fold")
    for spec in plan.specs:
        env = [f"{k}={v}" for k, v in spec.env.items()] + [f"{k}=<{p}>" for k, p in spec.secret_env.items()]
        table.add_row(spec.name, " ".join(spec.argv), " ".join(env), str(spec.log_path))
    console.print(table)
    owners = Table(
        title="which actor sends to which vLLM servers"
        + (" (and runs on the node of the first)" if cfg.world.kind == "ray" else "")
    )
    for column in ("actor", "vLLM servers", "prompts (positions in the run's prompt order)"):
        owners.add_column(column)
    k_all = cfg.actor.num_actors
    for k, (actor, servers) in enumerate(plan.actors.items()):
        owners.add_row(actor, ", ".join(servers), f"{k}, {k + k_all}, {k + 2 * k_all}, ..." if k_all > 1 else "all")
    console.print(owners)
    listening = Table(title='sockets the run will listen on (docs/operations.md, "What a run listens on")')
    for column in ("process", "what", "host", "port", "a client needs"):
        listening.add_column(column, overflow="fold")
    for listener in plan.sockets:
        listening.add_row(listener.process, listener.what, listener.host, listener.port, listener.secret)
    console.print(listening)
    if cfg.world.kind == "local":
        where = "; ".join(f"{name or 'the others'}: {','.join(map(str, c))}" for name, c in plan.cores.items())
        console.print(f"CPU cores (world.cpu_affinity={cfg.world.cpu_affinity}): {where or 'any process on any core'}")
        _print_gpu_plan(console, plan)
    if plan.slurm is not None:
        _print_slurm_steps(console, plan)
    if cfg.world.kind == "ray":
        placed = Table(title="where the processes go (world=ray: one placement group, reserved before anything starts)")
        for column in ("process", "ranks", "bundle reserved", "runs on"):
            placed.add_column(column, overflow="fold")
        for row in plan.placement:
            placed.add_row(*row)
        console.print(placed)
    console.print("[dim]ports marked 0 are chosen when the run starts; nothing was started.[/]")


def _print_gpu_plan(console: Console, plan: RunPlan) -> None:
    """world=local: each process's GPUs (CUDA_VISIBLE_DEVICES), or why none are placed."""
    gpus = plan.gpus
    if not gpus.on_gpus:
        device = plan.built.cfg.trainer.device
        console.print(
            f"GPUs: none placed ({gpus.visible.source}): vLLM as its build runs, the trainer on trainer.device={device}",
            highlight=False,
            markup=False,
        )
        if device.startswith("cuda"):
            console.print(
                f"[yellow]`rlrun train` here would refuse trainer.device={device}: no GPU visible.[/] Preview a GPU machine's "
                "plan with CUDA_VISIBLE_DEVICES=0,1,... before the command.",
                highlight=False,
            )
        return
    table = Table(title=f"GPUs of each process (world=local; {gpus.visible.source})")
    for column in ("process", "GPUs (CUDA_VISIBLE_DEVICES)", "shared with another process"):
        table.add_column(column, overflow="fold")
    for name, ids in gpus.gpus.items():
        table.add_row(name, ",".join(ids) or "none", "yes" if gpus.use(name) == "shared" else "-")
    console.print(table)


def _print_slurm_steps(console: Console, plan: RunPlan) -> None:
    """world=slurm: the batch script, then each process's node, ranks, GPUs and srun step."""
    from rlrun.cluster import slurm_plan

    slurm = plan.slurm
    assert slurm is not None  # world=slurm only
    if slurm.batch_script is not None:
        console.print(Syntax(slurm.batch_script, "bash", theme="ansi_dark", background_color="default"))
    table = Table(title=f"where the processes go (world=slurm: {slurm.where})")
    for column in ("process", "node", "ranks", "GPUs (indices on the node)"):
        table.add_column(column, overflow="fold")
    for name in slurm.plan.placed:
        table.add_row(name, *slurm_plan.describe(slurm.plan, name))
    console.print(table)
    console.print(
        "srun steps (each with --overlap: rlrun divides the nodes; a local process is a subprocess of rlrun in the batch step):"
    )
    for name, argv in slurm.steps.items():
        console.print(f"  {name}: {' '.join(argv)}", highlight=False, markup=False, soft_wrap=True)
