"""The experiment registry.

An experiment is a package `experiments/<paper>/<name>/` (one package per paper, PAPER_PACKAGES) with a
`run.py`. Its name is written once, as the package's folder name; the registry fills in Experiment.name.

Its `__init__.py` is its home, torch-free: the config class (`class CovRateConfig(Common):`, every key with
its type, paper default and comment), its PRESETS (what each preset changes) and the one declaration
`EXPERIMENT = Experiment(paper=..., figures=..., description=..., schema=..., presets=...)`. Discovery finds
the package, so adding an experiment touches no central list; `icl-exp list` and every composition import
the home alone.

What an experiment does is found by convention and imported only when called (Later): `run` and `validate`
in `<package>.run`, `plot` in `<package>.plots` where there is one, else in `<package>.run`; `claims.py` and
the math sit beside them.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.core.errors import UserError
from experiments.core.papers import PAPER_PACKAGES, experiment_module, experiment_packages

if TYPE_CHECKING:  # pandas and omegaconf cost 0.7 s to import: `icl-exp --help` needs neither
    import pandas as pd
    from omegaconf import DictConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"


@dataclass(frozen=True)
class Experiment:
    paper: str  # e.g. "Dherin et al."
    figures: str  # e.g. "Fig. 2"
    description: str  # one line
    # its keys: a dataclass subclass of config_schema.Common, written out beside the declaration; stored as the
    # option `experiment=NAME` (config_store.register_schemas). Every declaration gives one (get refuses one
    # that does not); None is for a test's stand-in, run on a config made by hand
    schema: type | None = None
    # what each preset changes, {preset: {key: value, node: {key: value}}}, only what differs from the paper's
    # defaults (tests/core/test_config_layout.py); a preset not named here runs the paper's settings
    presets: dict[str, dict] = field(default_factory=dict)
    # experiments whose run folder this one takes as `checkpoint=` (it loads their trained model instead of
    # training one): `icl-exp reproduce` runs them first and passes their folder
    needs: tuple[str, ...] = ()
    # what `icl-exp reproduce` sweeps for this experiment (`-m` with these overrides), e.g. gemma_match's two
    # open loops, the paper's Algorithm 1 and the conditioned variant, beside each other in the report
    reproduce_sweep: tuple[str, ...] = ()
    # a config key that, when set, names the run folder (patch_export's `out`): the CLI makes it hydra.run.dir
    run_dir_key: str | None = None
    # (device, dtype) the experiment always computes in, whatever device= and dtype= say (wq_reparam: its
    # constructions are float64 on the CPU): the runner gives it these, and run.json records what ran
    computes_in: tuple[str, str] | None = None
    # a sweep over seeds only: the fraction of seeds a claim must pass on to pass (core/seeds.py); every seed
    # unless an experiment says why fewer suffice
    seed_quorum: float = 1.0
    # False for an experiment whose output is not a figure (patch_export: a checkpoint): `icl-exp plot` says so
    draws_figures: bool = True
    # found by convention (get), imported when first called: a declaration leaves them out
    run: Callable[[object, object], None] | None = None  # run(cfg, ctx: RunContext); cfg: the typed config
    plot: Callable[[pd.DataFrame, Path], list[Path]] | None = None  # plot(metrics, figures_dir) -> files written
    validate: Callable[[object], None] | None = None  # raise UserError on bad config (config()), before a run
    # the experiment's name, written once: its package's folder name, from which the registry fills it in
    # (get); a declaration leaves it out
    name: str = field(default="", kw_only=True)

    def config(self, cfg: DictConfig):
        """What run() and validate() take: the schema's dataclass instance (config_schema.typed), so an
        experiment reads typed values and the schema's defaults, not casts and .get(key, default). Made at
        the boundary, from the composed DictConfig that the runner keeps for what is written about a run
        (run.json, the log) and that Hydra and the launchers pass around."""
        from experiments.core.config_schema import typed

        return typed(cfg)

    @property
    def figures_label(self) -> str:
        """`figures` for a heading or a log line: a note written in parentheses ("(checkpoint)") without them,
        since those add their own."""
        f = self.figures
        return f[1:-1] if f.startswith("(") and f.endswith(")") else f


class Later:
    """`module:function`, imported when first called: how a package's declaration (its __init__.py) names its
    run, plot and validate without importing them, so that `icl-exp list` and the schemas cost no torch. An
    object rather than a closure, so that a declaration stays picklable."""

    def __init__(self, target: str):
        self.module, _, self.function = target.partition(":")

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module(self.module), self.function)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Later({self.module}:{self.function})"


def experiment_names() -> list[str]:
    """Every experiment's name, from the folders alone (nothing imported): a paper's package with a run.py."""
    return sorted(experiment_packages())


def check_name(name: str) -> None:
    """UserError for a name with no experiment package, with a "did you mean". Imports nothing."""
    names = experiment_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        mean = f"did you mean {close[0]}? " if close else ""
        raise UserError(f"unknown experiment {name!r}; {mean}known: {', '.join(names)}")


def _plot_module(home: str) -> str:
    """Where plot is: plots.py where the package has one (so `icl-exp plot` imports matplotlib, not the run's
    torch), else run.py."""
    return f"{home}.plots" if experiment_packages()[home.split(".")[-1]].joinpath("plots.py").is_file() \
        else f"{home}.run"


def get(name: str) -> Experiment:
    """The experiment's declaration (its home imported: torch-free) with its name, and run, plot and validate
    by convention, each a Later that imports its module when first called."""
    check_name(name)
    home = _module_name(name)
    module = importlib.import_module(home)
    exp = getattr(module, "EXPERIMENT", None)
    if not isinstance(exp, Experiment):
        raise RuntimeError(f"{home} must define EXPERIMENT = Experiment(paper=..., schema=..., ...)")
    if exp.schema is None:
        raise RuntimeError(f"{home}: EXPERIMENT has no config class; give it schema=<Name>Config (a dataclass "
                           f"subclass of config_schema.Common written beside it)")
    if exp.name:  # the name is the folder's: a declaration that writes it again could only disagree
        raise RuntimeError(f"{home}: EXPERIMENT names itself {exp.name!r}; leave name= out "
                           f"(the registry takes it from the package's folder, {name})")
    return replace(exp, name=name, run=exp.run or Later(f"{home}.run:run"),
                   plot=exp.plot or Later(f"{_plot_module(home)}:plot"),
                   validate=exp.validate or Later(f"{home}.run:validate"))


def _module_name(name: str) -> str:
    module = experiment_module(name)
    if module is not None:
        return module
    raise RuntimeError(f"experiment {name} has no package experiments/<paper>/{name}/ with an __init__.py and a "
                       f"run.py (papers: {', '.join(PAPER_PACKAGES)})")


def paper_package(name: str) -> str:
    """The paper package an experiment lives in (e.g. "dherin")."""
    return _module_name(name).split(".")[1]


def _in_paper_order(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: (PAPER_PACKAGES.index(paper_package(n)), n))


def all_experiments() -> list[Experiment]:
    """Every experiment, grouped by paper (PAPER_PACKAGES order), by name within a paper."""
    return [get(name) for name in _in_paper_order(experiment_names())]


def describe(name: str) -> tuple[str, str, str, str]:
    """(name, paper, figures, description) of an experiment, from its home: importing it costs no torch
    (tests/zoo/test_layering.py), so `icl-exp list` stays fast."""
    exp = get(name)
    return exp.name, exp.paper, exp.figures, exp.description


def all_descriptions() -> list[tuple[str, str, str, str]]:
    """describe() for every experiment, in all_experiments() order."""
    return [describe(name) for name in _in_paper_order(experiment_names())]
