"""One pass of checks: a plain `icl-exp run` is composed once (by Hydra, in its job) and checked once there (the
device, threads, the model name, the experiment's validate, the model itself), and its load takes that check
instead of making it again. A refusal in the job is the CLI's one line, and the folder Hydra made for the job goes.
Counted in process, as typer's runner calls the CLI."""

from __future__ import annotations

from collections import Counter

from tests.helpers.cli import invoke_in_process


def _count(monkeypatch, counts: Counter, owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[label] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_a_plain_run_is_composed_once_and_checked_once(monkeypatch, tmp_path):
    from hydra._internal.hydra import Hydra

    from cli import check_job
    from experiments.goldwaser.patch_match import run
    from experiments.zoo import loading

    counts: Counter = Counter()
    _count(monkeypatch, counts, Hydra, "compose_config", "composed")
    _count(monkeypatch, counts, check_job, "check_job", "checked")
    _count(monkeypatch, counts, loading, "check_model", "model checked")
    _count(monkeypatch, counts, loading, "_checked_config", "model checks made")  # check_model's and a load's
    _count(monkeypatch, counts, run, "validate", "validated")  # what the declaration's Later("...:validate") calls
    run_dir = tmp_path / "run"
    result = invoke_in_process(*["run", "patch_match", "preset=smoke", "device=cpu", "model=tiny-llama",
                                      "max_new_tokens=2", f"hydra.run.dir={run_dir}"])
    assert result.exit_code == 0, result.output[-3000:]
    assert (run_dir / "claims.csv").is_file()
    assert counts == {"composed": 1, "checked": 1, "validated": 1, "model checked": 1, "model checks made": 1}, counts


def test_a_sweep_is_checked_whole_before_its_first_job(monkeypatch, tmp_path):
    """The control: a sweep's jobs are all checked by the CLI before the first begins (a bad value in the last
    costs no earlier job), and a job does not check again: one check per job there too. Its loads check their
    model again (zoo/kept_checks.py says why): two checks made per job, against one for a plain run."""
    from cli import check_job, overrides
    from experiments.zoo import loading

    counts: Counter = Counter()
    _count(monkeypatch, counts, overrides, "check_job", "checked")  # the CLI's checks of a sweep
    _count(monkeypatch, counts, check_job, "check_job", "checked")  # a job's own (none in a sweep)
    _count(monkeypatch, counts, loading, "check_model", "model checked")
    _count(monkeypatch, counts, loading, "_checked_config", "model checks made")  # check_model's and a load's
    sweep = tmp_path / "sweep"
    result = invoke_in_process("run", "patch_match", "preset=smoke", "device=cpu", "model=tiny-llama",
                               "max_new_tokens=2", "seed=0,1", "-m", f"hydra.sweep.dir={sweep}")
    assert result.exit_code == 0, result.output[-3000:]
    assert (sweep / "0" / "claims.csv").is_file() and (sweep / "1" / "claims.csv").is_file()
    assert counts == {"checked": 2, "model checked": 2, "model checks made": 4}, counts


def test_a_refusal_in_the_job_leaves_a_folder_the_user_made_as_it_was(tmp_path):
    """`hydra.run.dir=` an existing folder holding the user's file: the job's refusal removes what Hydra wrote
    there (.hydra/, the log) and keeps the folder and the file."""

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    result = invoke_in_process(*["run", "linreg_icl", "preset=smoke", "device=cpu", "threads=0",
                                      f"hydra.run.dir={mine}"])
    assert result.exit_code == 2
    assert "threads=0 must be at least 1" in " ".join(result.stderr.split())
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_cfg_job_is_composed_once_and_a_refusal_after_a_run_is_still_one_line(monkeypatch, tmp_path):
    """`--cfg job` prints Hydra's one composition; a bad key there, after a run in the same process (whose job
    began), is composition's one line, not the job's traceback."""
    from hydra._internal.hydra import Hydra

    ran = invoke_in_process("run", "linreg_icl", "preset=smoke", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}")
    assert ran.exit_code == 0, ran.output[-3000:]
    counts: Counter = Counter()
    _count(monkeypatch, counts, Hydra, "compose_config", "composed")
    shown = invoke_in_process("run", "linreg_icl", "train.steps=7", "--cfg", "job")
    assert shown.exit_code == 0 and "steps: 7" in shown.stdout, shown.output[-3000:]
    assert counts["composed"] == 1
    refused = invoke_in_process("run", "linreg_icl", "trian.steps=1", "--cfg", "job")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert " ".join(refused.stderr.split()).startswith("error: unknown config key 'trian.steps'"), refused.stderr
