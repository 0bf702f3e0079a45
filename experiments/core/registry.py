"""The experiment registry.

An experiment is a module `experiments/<paper>/<name>.py` (one package per paper, PAPER_PACKAGES)
that defines `EXPERIMENT = Experiment(paper=..., ...)` next to a config `conf/experiment/<name>.yaml`.
Discovery pairs the two, so adding an experiment touches no central list, and the name is written once, as
the two files' names (the registry fills in Experiment.name; the schema's key comes from its class name,
config_schema.experiment_schemas). Modules are imported
only when used (`list` reads the metadata by importing, which is cheap because heavy imports such
as transformers are done inside functions).

An experiment that outgrows a file is a package `experiments/<paper>/<name>/` found the same way: its
`__init__.py` is the declaration (EXPERIMENT, importing nothing heavy: run, plot and validate import
`run.py` when called), with `run.py` (validate, run), `claims.py` and `plots.py` beside it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.core.errors import UserError
from experiments.core.papers import PAPER_PACKAGES, experiment_module

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
    run: Callable[[object, object], None]  # run(cfg, ctx: RunContext); cfg: the typed config (config())
    plot: Callable[[pd.DataFrame, Path], list[Path]]  # plot(metrics, figures_dir) -> files written
    validate: Callable[[object], None] | None = None  # raise UserError on bad config (config()), before a run
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
    # the experiment's name, written once: its file names (conf/experiment/<name>.yaml, experiments/<paper>/
    # <name>.py or <name>/), from which the registry fills it in (get); a declaration leaves it out
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
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def check_name(name: str) -> None:
    """UserError for a name with no conf/experiment/<name>.yaml, with a "did you mean". Imports nothing."""
    names = experiment_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        mean = f"did you mean {close[0]}? " if close else ""
        raise UserError(f"unknown experiment {name!r}; {mean}known: {', '.join(names)}")


def get(name: str) -> Experiment:
    check_name(name)
    module = importlib.import_module(_module_name(name))
    exp = getattr(module, "EXPERIMENT", None)
    if not isinstance(exp, Experiment):
        raise RuntimeError(f"{module.__name__} must define EXPERIMENT = Experiment(paper=..., ...)")
    if exp.name:  # the name is the file's: a declaration that writes it again could only disagree
        raise RuntimeError(f"{module.__name__}: EXPERIMENT names itself {exp.name!r}; leave name= out "
                           f"(the registry takes it from conf/experiment/{name}.yaml)")
    return replace(exp, name=name)


def _module_name(name: str) -> str:
    module = experiment_module(name)
    if module is not None:
        return module
    raise RuntimeError(f"conf/experiment/{name}.yaml has no module experiments/<paper>/{name}.py "
                       f"or package experiments/<paper>/{name}/__init__.py "
                       f"(papers: {', '.join(PAPER_PACKAGES)})")


def paper_package(name: str) -> str:
    """The paper package an experiment lives in (e.g. "dherin")."""
    return _module_name(name).split(".")[1]


def all_experiments() -> list[Experiment]:
    """Every experiment, grouped by paper (PAPER_PACKAGES order), by name within a paper."""
    names = sorted(experiment_names(), key=lambda n: (PAPER_PACKAGES.index(paper_package(n)), n))
    return [get(name) for name in names]


def describe(name: str) -> tuple[str, str, str, str]:
    """(name, paper, figures, description) of an experiment, read from the literal keywords of its
    `EXPERIMENT = Experiment(...)` without importing the module: importing one pulls in torch, and
    `icl-exp list` would wait seconds for it. Falls back to importing when a field is not a literal."""
    import ast

    spec = importlib.util.find_spec(_module_name(name))
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    constants = {}  # module-level NAME = "literal" (e.g. `paper=PAPER`)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            constants.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPERIMENT" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            fields = {k.arg: k.value for k in node.value.keywords}
            try:
                values = [constants[fields[f].id] if isinstance(fields.get(f), ast.Name)
                          else ast.literal_eval(fields[f]) for f in ("paper", "figures", "description")]
            except (KeyError, ValueError):
                break
            return (name, *values)
    exp = get(name)
    return exp.name, exp.paper, exp.figures, exp.description


def all_descriptions() -> list[tuple[str, str, str, str]]:
    """describe() for every experiment, in all_experiments() order."""
    names = sorted(experiment_names(), key=lambda n: (PAPER_PACKAGES.index(paper_package(n)), n))
    return [describe(name) for name in names]
