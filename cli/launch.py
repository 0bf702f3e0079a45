"""One way into a run: `icl-exp run`, `icl-exp patch export` and `icl-exp patch compile` all call
`launch(name, overrides, multirun)`. It checks the command line (one line for a bad one, before any
folder exists), picks the run folder and hands argv to Hydra's own entry point."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import typer

from cli.hydra_flags import hydra_flags
from cli.output import err_console, fail, unique_stamp
from experiments.core.errors import UserError


def launch(name: str, overrides: list[str], multirun: bool = False) -> Path | None:
    """Run experiment `name` with Hydra `overrides` (a sweep when `multirun`); the run folder once done."""
    started: dict = {}  # the run folder, once chosen, and whether it was there before
    try:
        return _launch(name, list(overrides), multirun, started)
    except KeyboardInterrupt:  # Ctrl-C before the job began (a job's own Ctrl-C is hydra_app's line)
        _interrupted_at_start(started, multirun)


def _interrupted_at_start(started: dict, multirun: bool) -> None:
    """One line and exit 130, as for an interrupted run. A folder Hydra made for this run before its job
    wrote run.json holds nothing but Hydra's config: removed, so nothing half-made stays behind."""
    import shutil

    out = Path(started["out_dir"]) if started.get("out_dir") and "${" not in started["out_dir"] else None
    began = out is not None and ((out / "run.json").exists() or multirun and out.exists())
    if began:  # a job had started (its own line did not come: Ctrl-C hit between jobs or in Hydra's code)
        err_console.print(f"interrupted (Ctrl-C): what was written is in {out.absolute()}", highlight=False,
                          soft_wrap=True)
    else:
        if out is not None and not started.get("existed") and out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
        err_console.print("interrupted (Ctrl-C) while starting, before the run began: nothing was written",
                          highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def _launch(name: str, overrides: list[str], multirun: bool, started: dict) -> Path:
    """Check the command line, choose the run folder, hand over to Hydra; the run folder once it is done."""
    from cli.hydra_flags import ONE_CONFIG
    from cli.overrides import check_command_line

    if any(flag.split("=", 1)[0] in ONE_CONFIG for flag in hydra_flags(overrides)):
        return _show(name, overrides, multirun)
    try:
        exp, cfg = check_command_line(name, overrides, multirun)  # every job checked here, once
        from experiments.core.distributed import (  # imports torch: after a bad override has been said
            agree_across_ranks,
            check_gpu_count,
            hydra_overrides_for_rank,
            is_main_process,
        )

        check_gpu_count(cfg.get("device", "auto"))  # under torchrun: a GPU per rank, said once, before anything
        dir_key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        given = [o.split("=", 1)[1] for o in overrides if o.startswith(dir_key + "=")]
        own = cfg.get(exp.run_dir_key) if exp.run_dir_key else None  # the experiment's key for its run folder:
        if not given and not multirun and own:  # its value is the folder, and stays in run.json's overrides
            given = [str(own)]
            overrides.append(f"{dir_key}={own}")
        if given:
            out_dir = given[-1]
        else:
            stamp = agree_across_ranks(unique_stamp())  # under torchrun every rank takes rank 0's folder
            out_dir = f"results/{name}/multirun/{stamp}" if multirun else f"results/{name}/{stamp}"
            overrides.append(f"{dir_key}={out_dir}")
        started.update(out_dir=out_dir, existed=Path(out_dir).exists())
        if "${" not in out_dir and is_main_process():  # rank 0 makes the folder the others share
            check_writable(out_dir)
        overrides += hydra_overrides_for_rank()  # ranks > 0 write no .hydra/ and no log file
    except UserError as err:
        fail(str(err))

    from cli import hydra_app

    # Hydra's parser takes the overrides before its own flags (`--cfg job`, `--info`, ...).
    flags = hydra_flags(overrides)
    plain = [o for o in overrides if o not in flags]
    sys.argv = ["icl-exp", f"experiment={name}", *plain, *flags, *(["--multirun"] if multirun else [])]
    hydra_app.main()
    return Path(out_dir)


def _show(name: str, overrides: list[str], multirun: bool) -> None:
    """`icl-exp run NAME ... --cfg job` (or `--info`): Hydra prints the composed config and runs nothing, so the
    command line is checked as far as composition checks it (keys, types; one line for a bad one) and no run
    folder is chosen or made: the answer imports no experiment module, torch or pandas."""
    from cli import hydra_app
    from cli.overrides import check_command_line

    try:
        check_command_line(name, overrides, multirun, jobs=False)
    except UserError as err:
        fail(str(err))
    flags = hydra_flags(overrides)
    plain = [o for o in overrides if o not in flags]
    sys.argv = ["icl-exp", f"experiment={name}", *plain, *flags]
    hydra_app.main()


def check_writable(folder: str | os.PathLike) -> None:
    """The output folder must be a folder this process can make and write a file in. Tried for real
    (os.access says yes for root on /proc and /sys); whatever the try made is removed again."""
    path = Path(folder).expanduser().absolute()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"cannot write the output folder {path}: {probe} is not a folder")
    if path.exists() and any(path.iterdir()) and (path / "run.json").exists():
        raise UserError(f"{path} already holds a run; choose another hydra.run.dir")
    made_here = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".icl-exp-write-check.", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise UserError(f"cannot write the output folder {path}: {err.strerror or err}") from None
    finally:  # remove the run folder the try made (if empty). Parents it made stay: the run uses them
        if made_here:  # next, and removing them could race with a run started beside this one
            try:
                path.rmdir()
            except OSError:
                pass
