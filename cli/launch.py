"""One way into a run: `icl-exp run`, `icl-exp patch export` and `icl-exp patch compile` all call
`launch(name, overrides, multirun)`. It reads the command line (one line for a bad one, before any folder
exists), picks the run folder and hands argv to Hydra's own entry point, which composes each job once; a plain
run's job checks itself and a refusal there leaves no folder (`_run_checked_in_job`), a sweep's jobs are
checked here first (`_launch`)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
    """Check the command line, choose the run folder, hand over to Hydra; the run folder once it is done.

    A sweep is checked whole here, every job's config composed and checked before the first starts (a bad 17th
    value costs no 16 jobs; cli/overrides.check_command_line). A plain run is composed once, by Hydra, and
    checked once, in its job, before run.json (cli/hydra_app.py): its refusal is the same one line, and the
    folder Hydra made for it is removed. Under torchrun a plain run is checked here too: every rank needs its
    GPU count said before the ranks agree on a folder."""
    from cli.hydra_flags import ONE_CONFIG
    from cli.overrides import check_command_line, check_line

    if any(flag.split("=", 1)[0] in ONE_CONFIG for flag in hydra_flags(overrides)):
        return _show(name, overrides, multirun)
    try:
        from experiments.core import ranks, registry  # neither imports torch

        torchrun = ranks.info().distributed
        checked_here = multirun or torchrun
        if checked_here:
            exp, cfg = check_command_line(name, overrides, multirun)  # every job checked here, once
            from experiments.core.distributed import check_gpu_count  # torch: once the command line is read

            check_gpu_count(cfg.get("device", "auto"))  # under torchrun: a GPU per rank, before the ranks agree
            own = cfg.get(exp.run_dir_key) if exp.run_dir_key else None
        else:  # the experiment's declaration (its home, no torch) names the key of its run folder
            parsed = check_line(name, overrides, multirun)
            exp = registry.get(name)
            own = next((o.value() for o in reversed(parsed) if exp.run_dir_key and o.key_or_group ==
                        exp.run_dir_key), None)
        dir_key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        given = [o.split("=", 1)[1] for o in overrides if o.startswith(dir_key + "=")]
        # the experiment's key for its run folder: its value is the folder, and stays in run.json's overrides
        if not given and not multirun and own:
            given = [str(own)]
            overrides.append(f"{dir_key}={own}")
        if given:
            out_dir = given[-1]
        else:
            stamp = unique_stamp()
            if torchrun:  # every rank takes rank 0's
                from experiments.core.distributed import agree

                stamp = agree(stamp)
            out_dir = f"results/{name}/multirun/{stamp}" if multirun else f"results/{name}/{stamp}"
            overrides.append(f"{dir_key}={out_dir}")
        started.update(out_dir=out_dir, existed=Path(out_dir).exists())
        if "${" not in out_dir and ranks.is_main_process():  # rank 0 makes the folder the others share
            check_writable(out_dir)
        overrides += ranks.hydra_overrides_for_rank()  # ranks > 0 write no .hydra/ and no log file
    except UserError as err:
        fail(str(err))

    # Hydra's parser takes the overrides before its own flags (`--cfg job`, `--info`, ...).
    flags = hydra_flags(overrides)
    plain = [o for o in overrides if o not in flags]
    mode = "hydra.mode=MULTIRUN" if multirun else "hydra.mode=RUN"  # read from here, not composed (hydra_app.py)
    sys.argv = ["icl-exp", f"experiment={name}", *plain, mode, *flags, *(["--multirun"] if multirun else [])]
    if checked_here:
        from cli import hydra_app  # after argv: it stores the config of the experiment argv names

        hydra_app.main()
    else:
        _run_checked_in_job(name, [o.key_or_group for o in parsed], started)
    return Path(out_dir)


def _run_checked_in_job(name: str, keys: list[str], started: dict) -> None:
    """A plain run: Hydra composes its config (once) and its job checks it (hydra_app.check_in_job); a value
    composition refuses is worded as the CLI words it (`_composition_worded`). A job's refusal leaves no folder
    behind: what Hydra wrote before the job began (.hydra/, the log) is removed, and the folder too when this
    run made it."""
    from cli import hydra_app

    try:
        with _composition_worded(name, keys), hydra_app.checked_in_job():
            hydra_app.main()
    except SystemExit as end:
        if end.code == 2 and not hydra_app.job_began():
            _remove_unbegun(started)
        raise


@contextmanager
def _composition_worded(name: str, keys: list[str]) -> Iterator[None]:
    """While the CLI hands a command line to Hydra, which composes it once: what composition refuses (an unknown
    key, an ill-typed value) reaches the CLI as Hydra's own exception (HYDRA_FULL_ERROR=1, instead of Hydra
    printing it) and is worded as every other refusal (cli/config_errors.py), one line, exit 2. Past
    composition (a job that began) an exception is the job's own."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cli import hydra_app
    from cli.config_errors import composition_error, refused_in

    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    hydra_app.forget_job()
    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        if hydra_app.job_began():
            raise
        fail(composition_error(err, name, keys, refused_in(err)))  # keys: the overrides' keys, as typed
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


def _remove_unbegun(started: dict) -> None:
    """The run folder of a job refused before it began: Hydra's files in it removed, and the folder too when
    this command made it (a folder the user made stays, as it was)."""
    import shutil

    out = Path(started["out_dir"])
    if not started.get("existed"):
        shutil.rmtree(out, ignore_errors=True)
        return
    shutil.rmtree(out / ".hydra", ignore_errors=True)
    (out / "icl-exp.log").unlink(missing_ok=True)


def _show(name: str, overrides: list[str], multirun: bool) -> None:
    """`icl-exp run NAME ... --cfg job` (or `--info`): Hydra composes the config once and prints it, running
    nothing; the command line is read first (`check_line`), a value composition refuses is the same one line as
    for a run, and no run folder is chosen or made: the answer imports no experiment module, torch or pandas."""
    from cli.overrides import check_line

    try:
        parsed = check_line(name, overrides, multirun)
    except UserError as err:
        fail(str(err))
    flags = hydra_flags(overrides)
    plain = [o for o in overrides if o not in flags]
    sys.argv = ["icl-exp", f"experiment={name}", *plain, *flags]
    from cli import hydra_app

    with _composition_worded(name, [o.key_or_group for o in parsed]):
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
