"""The papers the tool reproduces: one package under experiments/ each, in the order `icl-exp list` and the
report show them, and which of them an experiment lives in. Its own module so that the registry and the
config schemas both read it without importing each other. Read from the folders alone: finding an experiment
imports nothing."""

from pathlib import Path

PAPER_PACKAGES = ("dherin", "goldwaser", "karbevski", "xu_fang")
EXPERIMENTS_DIR = Path(__file__).resolve().parents[1]


def experiment_packages() -> dict[str, Path]:
    """name -> folder of every experiment: a paper's package with an __init__.py (its home) and a run.py (what
    it does). A paper's other packages (dherin/models/, karbevski/gpt/) have no run.py."""
    found = {}
    for paper in PAPER_PACKAGES:
        for run in sorted((EXPERIMENTS_DIR / paper).glob("*/run.py")):
            if (run.parent / "__init__.py").is_file():
                found[run.parent.name] = run.parent
    return found


def experiment_module(name: str) -> str | None:
    """The home module of experiment `name`, `experiments.<paper>.<name>`, found without importing it; None
    when no paper has one."""
    folder = experiment_packages().get(name)
    return f"experiments.{folder.parent.name}.{name}" if folder is not None else None
