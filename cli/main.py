"""`icl-exp`: list experiments, run one (or sweep with -m), re-plot finished results."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
import typer.core

from cli.output import fail, unique_stamp  # noqa: F401  (unique_stamp: the tests import it from here)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Reproduce, figure by figure, four papers on how a transformer turns its context into weights.",
)
@app.command("list")
def list_experiments() -> None:
    """Every registered experiment, one line each, grouped by paper: name, paper, figure(s), what it shows."""
    from experiments.core import registry

    rows = registry.all_descriptions()
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, paper, figures, description in rows:
        print(f"{name:<{widths[0]}}  {paper:<{widths[1]}}  {figures:<{widths[2]}}  {description}")


def _presets() -> list[str]:
    """`name: what it is` for each conf/preset/*.yaml, from the first sentence of its `# preset=NAME: ...`
    comment (which may go on over the next comment lines)."""
    from experiments.core.registry import CONF_DIR

    out = []
    for path in sorted((CONF_DIR / "preset").glob("*.yaml"), key=lambda p: (p.stem != "paper", p.stem)):
        comment = " ".join(line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#"))
        _, found, what = comment.partition(f"preset={path.stem}:")
        what = what.split(". ")[0].strip().rstrip(".") if found else ""
        out.append(f"{path.stem}: {what}" if what else path.stem)
    return out


class _RunCommand(typer.core.TyperCommand):
    """`Usage: icl-exp run [OPTIONS] NAME [KEY=VALUE]...` (typer would write the argument as `{NAME}`)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return ["[OPTIONS]", "NAME", "[KEY=VALUE]..."]


def _run_help() -> str:
    """`icl-exp run --help`: what to type, the experiments and presets there are, where the keys are.
    One line per paragraph: rich wraps them to the terminal, a hard line break would stay mid-sentence."""
    from experiments.core.registry import experiment_names

    return "\n\n".join([
        "Run the experiment NAME with Hydra overrides (key=value), e.g. `icl-exp run linreg_icl preset=cpu seed=1`.",
        f"Experiments: {', '.join(experiment_names())} (one line each: `icl-exp list`).",
        f"Presets (preset=NAME): {'; '.join(_presets())}.",
        "Every key of an experiment and its value: `icl-exp run NAME --cfg job` (prints the composed config, "
        "runs nothing).",
        "Overrides go to Hydra's own entry point, so `-m` (a sweep: `-m seed=0,1,2`), `hydra/launcher=parallel` "
        "or `hydra/launcher=slurm`, `hydra.run.dir=...`, `hydra.sweep.dir=...` and `--cfg job` work as in any "
        "Hydra app.",
        "A sweep that stopped: `icl-exp resume SWEEP_DIR` runs its unfinished jobs. A tracker: logger=mlflow, "
        "logger=tensorboard or logger=wandb (offline by default).",
    ])


def _has_key(name: str, key: str) -> bool:
    """Whether experiment NAME's typed config has `key` (False for an unknown name: launch words that)."""
    import dataclasses

    from experiments.core.registry import experiment_names, get

    if name not in experiment_names():
        return False
    return key in {f.name for f in dataclasses.fields(get(name).schema)}


@app.command(cls=_RunCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             help=_run_help())
def run(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="experiment name (see `icl-exp list`)"),
    multirun: bool = typer.Option(False, "-m", "--multirun", help="sweep: comma-separated values run one job each"),
) -> Path | None:
    """Run NAME with Hydra overrides (the help text is _run_help)."""
    from cli.launch import launch

    args = list(ctx.args)
    # `-m ... resume=SWEEP_DIR`: the sweep's unfinished jobs; an experiment with a `resume` key of its own
    # (gpt_wq: a training run to continue) keeps it, and its sweeps resume with `icl-exp resume SWEEP_DIR`
    if multirun and any(a.startswith("resume=") for a in args) and not _has_key(name, "resume"):
        from cli.resume import ALLOW_CHANGED, resume_sweep

        folder = [a.split("=", 1)[1] for a in args if a.startswith("resume=")][-1]
        rest = [a for a in args if not a.startswith("resume=") and a != ALLOW_CHANGED]
        return resume_sweep(Path(folder), ALLOW_CHANGED in args, name, rest)
    return launch(name, args, multirun)


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="a run folder, a multirun folder to combine, or a folder of "
                                   "experiments' runs (results/) to draw every figure the docs show"),
    docs: Path = typer.Option(None, "--docs", help="with a folder of runs: the docs folder whose figures/ "
                              "gets every figure (default: docs/ beside that folder, where there is one)"),
) -> None:
    """Re-render figures from the runs' CSVs alone (no recomputation). On results/: every run's figures,
    copied into docs/figures (each PNG names the table it was drawn from), the manifest results/README.md
    and the paper-by-paper page docs/papers.md."""
    import logging

    from experiments.core.console import ConsoleFormatter, plain_console
    from experiments.core.errors import UserError
    from experiments.core.figures import render
    from experiments.core.results_root import is_results_root

    # warnings (an incomplete run, jobs left out of a sweep) as one `warning: ...` line each
    handler = logging.StreamHandler()
    handler.setFormatter(ConsoleFormatter("%(message)s"))
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("experiments")
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        if is_results_root(run_dir):
            from experiments.core.docs_build import rebuild

            paths = rebuild(run_dir, docs if docs is not None else _docs_beside(run_dir))
        elif docs is not None:
            raise UserError(f"--docs is for a folder of experiments' runs (results/); {run_dir} is not one")
        else:
            paths = render(run_dir)
    except UserError as err:
        fail(str(err))
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    out = plain_console()
    for p in paths:
        out.print(str(p))  # never hard-wrapped, also when piped


def _docs_beside(results: Path) -> Path | None:
    """results/'s sibling docs/ (the repository's), or None: the figures then stay in each run's figures/."""
    docs = Path(results).resolve().parent / "docs"
    return docs if docs.is_dir() else None


def _register_subcommands() -> None:
    """Sub-apps living in their own modules (e.g. `icl-exp patch export`)."""
    import importlib

    for module_name, attr, cmd in (("cli.patch", "app", "patch"), ("cli.report", "report", "report"),
                                   ("cli.reproduce", "reproduce", "reproduce"),
                                   ("cli.resume", "resume", "resume"), ("cli.show", "show", "show"),
                                   ("cli.models", "models", "models")):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        target = getattr(module, attr)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=cmd)
        else:  # a single command (`icl-exp report`), with its own context settings if it says so
            app.command(cmd, context_settings=getattr(target, "context_settings", None))(target)


_register_subcommands()


def main() -> None:
    """The `icl-exp` console script: the Typer app; a torchrun rank then ends by `distributed.end_rank`,
    past interpreter finalization, where gloo can abort a rank that has done its work."""
    try:
        app()
    except SystemExit as done:
        if _in_process_group():
            _end_rank(done.code)
        raise
    except BaseException:
        if _in_process_group():  # report the error, then end as a finished rank does
            import traceback

            traceback.print_exc()
            _end_rank(1)
        raise


def _in_process_group() -> bool:
    """Only a command that imported torch.distributed can be in a group: `icl-exp list` never imports torch."""
    return "torch.distributed" in sys.modules and sys.modules["torch.distributed"].is_initialized()


def _end_rank(code) -> None:
    from experiments.core import distributed

    distributed.end_rank(code)


if __name__ == "__main__":
    main()
