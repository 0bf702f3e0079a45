"""docs/design.md's recipes match the code. Each recipe's table names the files of a real example in the tree:
they exist, each is the example's (it names the example), and the count in the recipe's heading is theirs.
The experiment recipe is followed for real: in a copy of the code a new experiment is added exactly at the
files the recipe lists, its home, run.py, snapshot and two tests (a step the recipe gains or loses fails here
until this test follows it too), its snapshot written by the recipe's own command, and the suite's generic
tests run on it in the copy: the config layout, the snapshots, the run-folder contract (a real `python -m
cli.main run NAME preset=smoke`), its own test and its claim fed a broken input."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.repo import REPO_ROOT

DESIGN = REPO_ROOT / "docs" / "design.md"
HEADING = re.compile(r"^### Recipe: (?P<what>.+?) — (?P<count>\d+) files \(example: (?P<example>[\w.-]+)\)$", re.M)


@dataclass
class Row:
    number: int
    file: str  # the recipe's path, with placeholders: experiments/<paper>/<name>/run.py
    example: str  # the example's file(s), a glob: experiments/patching/arch/*.py
    what: str


@dataclass
class Recipe:
    what: str
    count: int
    example: str
    rows: list[Row]


def recipes(text: str) -> list[Recipe]:
    """Every `### Recipe: ... — N files (example: X)` heading with the rows of the table that follows it."""
    found = []
    for match in HEADING.finditer(text):
        body = text[match.end():].split("\n### ", 1)[0]
        rows = []
        for line in body.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")] if line.startswith("| ") else []
            if len(cells) == 4 and cells[0].isdigit():
                file, example = (re.search(r"`([^`]+)`", c).group(1) for c in cells[1:3])
                rows.append(Row(int(cells[0]), file, example, cells[3]))
        found.append(Recipe(match["what"], int(match["count"]), match["example"], rows))
    return found


def recipe(what: str) -> Recipe:
    return next(r for r in recipes(DESIGN.read_text()) if r.what == what)


def mentions(path: Path, name: str) -> bool:
    """Whether a file is the example's: its name in the path or the text, in any case, `_` optional."""
    wanted = name.lower().replace("_", "")
    return wanted in str(path).lower().replace("_", "") or wanted in path.read_text().lower().replace("_", "")


def recipe_problems(r: Recipe, root: Path) -> list[str]:
    """What is wrong with a recipe against the tree at `root`: rows out of order, an example file that is not
    there or does not name the example, a count in the heading that is not the number of the example's files."""
    problems = []
    if [row.number for row in r.rows] != list(range(1, len(r.rows) + 1)):
        problems.append(f"rows numbered {[row.number for row in r.rows]}")
    files = []
    for row in r.rows:
        matched = sorted(root.glob(row.example))
        if not matched:
            problems.append(f"row {row.number}: no file {row.example}")
        files += matched
    if len(set(files)) != r.count:
        problems.append(f"the heading says {r.count} files, the rows name {len(set(files))}")
    problems += [f"{f.relative_to(root)} does not name {r.example}" for f in files if not mentions(f, r.example)]
    return problems


def test_the_recipes_are_found():
    assert [r.what for r in recipes(DESIGN.read_text())] == ["add an experiment", "add a model family",
                                                             "add an output rule (a Table 1 row)"]
    text = ("### Recipe: do x — 2 files (example: foo)\n\n| # | File | foo's | What |\n|---|---|---|---|\n"
            "| 1 | `a/<n>.py` (new) | `a/foo.py` | its code |\n| 2 | `b.py` | `b/*.py` | `B` |\n\n"
            "### Next\n| 3 | `c` | `c` | c |\n")
    assert recipes(text) == [Recipe("do x", 2, "foo", [Row(1, "a/<n>.py", "a/foo.py", "its code"),
                                                        Row(2, "b.py", "b/*.py", "`B`")])]


@pytest.mark.parametrize("what", ["add an experiment", "add a model family", "add an output rule (a Table 1 row)"])
def test_a_recipes_files_are_its_examples_and_as_many_as_it_says(what):
    assert recipe_problems(recipe(what), REPO_ROOT) == []


def test_a_wrong_recipe_is_caught(tmp_path):
    """The control: a miscount, a file that is not there, and one that is not the example's are all named."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "foo.py").write_text("foo = 1\n")
    (tmp_path / "a" / "other.py").write_text("bar = 1\n")
    rows = [Row(1, "a/<n>.py", "a/foo.py", ""), Row(2, "a/x.py", "a/other.py", ""), Row(4, "b.py", "b.py", "")]
    assert recipe_problems(Recipe("do x", 4, "foo", rows), tmp_path) == [
        "rows numbered [1, 2, 4]", "row 4: no file b.py", "the heading says 4 files, the rows name 2",
        "a/other.py does not name foo"]


# -- the experiment recipe, followed for real ----------------------------------------------------------
NAME, PAPER = "mean_rate", "xu_fang"

HOME = '''\
"""mean_rate: a sample mean's variance is σ²/n (the design page's recipe, followed by a test).

  icl-exp run mean_rate -m scale=1,2
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default
from experiments.core.registry import Experiment


@dataclass
class MeanRateConfig(Common):
    """mean_rate (the design page's recipe, followed by a test)."""

    ns: list[int] = default([1, 4, 16, 64])  # sample sizes
    trials: int = 20000  # means per sample size
    scale: float = 2.0  # σ of the draws
    tolerance: float = 0.3  # |n·Var(X̄_n)/σ² − 1|


PRESETS = {
    "smoke": {"trials": 2000},  # seconds
    "cpu": {"trials": 5000},  # a second
}

EXPERIMENT = Experiment(
    paper="Xu & Fang",
    figures="(recipe check)",
    description="n·Var(X̄_n)/σ² = 1 for independent draws",
    schema=MeanRateConfig,
    presets=PRESETS,
)
'''

RUN = '''\
"""mean_rate: a sample mean's variance is σ²/n (the design page's recipe, followed by a test)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from experiments.core.errors import UserError
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext


def sample_means(n: int, trials: int, scale: float, generator: torch.Generator) -> torch.Tensor:
    """`trials` means, each of n independent N(0, scale²) draws."""
    return (scale * torch.randn(trials, n, generator=generator, dtype=torch.float64)).mean(1)


def variance_ratio(means: torch.Tensor, n: int, scale: float) -> float:
    """n·Var(X̄_n) / σ², from the means alone: 1 for independent draws."""
    return float(means.var() * n / scale**2)


def run(cfg: DictConfig, ctx: RunContext) -> None:
    generator = torch.Generator().manual_seed(cfg.seed)
    ratios = []
    with progress(len(cfg.ns), "mean_rate") as bar:
        for n in cfg.ns:
            ratios.append(variance_ratio(sample_means(int(n), cfg.trials, cfg.scale, generator), int(n), cfg.scale))
            ctx.log("n_var_over_sigma2", ratios[-1], n=int(n))
            bar.advance(1)
    check_claims(ctx, cfg, ratios)


def check_claims(ctx: RunContext, cfg: DictConfig, ratios: list[float]) -> None:
    ctx.check("xu_fang.recipe.mean_variance", "docs/design.md recipe", "n·Var(X̄_n)/σ² of independent draws is 1, "
              "the n furthest from it", max(ratios, key=lambda r: abs(r - 1.0)), "within", cfg.tolerance,
              paper_value=1.0, measure="n·Var(X̄_n)/σ², worst n")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(1)
    ax = axes[0][0]
    rows = metric(metrics, "n_var_over_sigma2")
    ax.plot(rows["n"], rows["value"], "o-", color="C0", label="measured")
    ax.axhline(1.0, color="C1", ls="--", label="σ²/n")
    ax.set(xscale="log", xlabel="n", ylabel="n·Var(X̄_n)/σ²")
    ax.legend()
    return save_figure(fig, figures_dir, "mean_rate")


def validate(cfg: DictConfig) -> None:
    if cfg.trials < 2 or min(cfg.ns) < 1 or cfg.scale <= 0:
        raise UserError(f"trials={cfg.trials} must be at least 2, ns={list(cfg.ns)} at least 1, scale positive")
'''

OWN_TEST = '''\
import pandas as pd


def test_mean_rate_is_near_one_at_every_n(smoke_runs):
    metrics = pd.read_csv(smoke_runs("mean_rate") / "metrics.csv")
    assert sorted(metrics["n"]) == [1, 4, 16, 64] and (metrics["value"] - 1).abs().max() < 0.3
'''

BROKEN_INPUT_TEST = '''


def test_mean_rate_fails_on_dependent_draws(tmp_path):
    """The means of n copies of one draw: n·Var/σ² = n, and the claim fails; independent draws pass."""
    import torch

    from experiments.xu_fang.mean_rate.run import check_claims, sample_means, variance_ratio

    generator = torch.Generator().manual_seed(0)
    copies = (2.0 * torch.randn(2000, 1, generator=generator, dtype=torch.float64)).expand(2000, 16).mean(1)
    for means, passes in ((copies, False), (sample_means(16, 2000, 2.0, generator), True)):
        ctx = RunContext(run_dir=tmp_path, experiment="mean_rate", run_id="r")
        check_claims(ctx, OmegaConf.create({"tolerance": 0.3}), [variance_ratio(means, 16, 2.0)])
        assert bool(ctx.claims()["passed"].iloc[0]) is passes
'''


def follow(row: Row, repo: Path) -> None:
    """Do what one row of the experiment recipe says, for mean_rate in the paper xu_fang."""
    path = repo / row.file.replace("<paper>", PAPER).replace("<name>", NAME)
    if row.file == "experiments/<paper>/<name>/__init__.py":
        path.parent.mkdir(exist_ok=True)
        path.write_text(HOME)
    elif row.file == "experiments/<paper>/<name>/run.py":
        path.parent.mkdir(exist_ok=True)
        path.write_text(RUN)
    elif row.file == "tests/core/cfg_snapshots/<name>.yaml":
        command = re.search(r"`(python -m [^`]+)`", row.what).group(1).replace("<name>", NAME).split()
        subprocess.run([sys.executable, *command[1:]], cwd=repo, check=True, capture_output=True, env=_env(repo))
    elif row.file == "tests/<paper>/test_<name>.py":
        path.write_text(OWN_TEST)
    elif row.file == "tests/<paper>/test_claims_fail_on_broken_inputs.py":
        path.write_text(path.read_text() + BROKEN_INPUT_TEST)
    else:
        raise AssertionError(f"the recipe has a step this test does not follow: {row.file} ({row.what})")


def _env(repo: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.numeric  # the new experiment's claim is a statistic of seeded draws
def test_following_the_experiment_recipe_gives_a_run_that_keeps_the_contract(tmp_path):
    repo = tmp_path / "repo"
    for part in ("cli", "experiments", "conf", "hydra_plugins", "tests"):
        shutil.copytree(REPO_ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", repo)  # pytest's markers and options
    for row in recipe("add an experiment").rows:
        follow(row, repo)
    assert sorted(p.name for p in (repo / "tests/core/cfg_snapshots").glob(f"{NAME}.*")) == [f"{NAME}.yaml"]
    assert (repo / "tests/core/cfg_snapshots" / f"{NAME}.yaml").read_text().count("\ntrials: 2000\n") == 1  # smoke's

    tests = ["tests/core/test_config_layout.py", "tests/core/test_cfg_snapshots.py",
             "tests/core/test_run_folder_contract.py", f"tests/{PAPER}/test_{NAME}.py",
             f"tests/{PAPER}/test_claims_fail_on_broken_inputs.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "pytest"), *tests, "-k", NAME], cwd=repo, env=_env(repo),
                          capture_output=True, text=True, timeout=600)
    # config layout: defaults, 2 presets; 4 snapshots (one per preset); the contract; its test; its broken input
    assert proc.returncode == 0 and re.search(r"\b10 passed", proc.stdout), proc.stdout[-3000:] + proc.stderr[-2000:]

    run_dir = next((tmp_path / "pytest").rglob(f"smoke_runs*/{NAME}"))  # `python -m cli.main run NAME preset=smoke`
    claims = pd.read_csv(run_dir / "claims.csv")
    assert list(claims["id"]) == ["xu_fang.recipe.mean_variance"] and claims["passed"].all()
    assert len(pd.read_csv(run_dir / "metrics.csv")) == 4 and (run_dir / "figures" / f"{NAME}.png").is_file()
    listed = run_cli("list", cwd=repo, env=_env(repo))
    assert listed.returncode == 0, listed.stderr[-3000:]
    listed = listed.stdout
    assert re.search(rf"^{NAME}\s+Xu & Fang", listed, re.M)  # the registry found it: no list to add it to
    assert not (REPO_ROOT / "experiments" / PAPER / NAME).exists()  # the real tree was never touched


# -- the family recipe, followed for real --------------------------------------------------------------
# SmolLM3's decoder layer is Llama's (some layers skip the rotary embedding, which Table 1 does not see): an
# adapter file of a few lines, as qwen3.py is
FAMILY_MODULE = '''\
"""SmolLM3 (the design page's recipe, followed by a test): Llama's block."""

from dataclasses import replace

from experiments.patching.arch import llama
from experiments.patching.arch.base import tiny_common
from experiments.patching.families import said_by


def tiny_config(vocab_size: int):
    """tiny-smollm3: 4 layers, d = 64, GQA 4:2, SwiGLU 128."""
    from transformers import SmolLM3Config

    return SmolLM3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=4096, **tiny_common(vocab_size))


ADAPTER = replace(llama.ADAPTER, **said_by("smollm3"), tiny_config=tiny_config)
'''
FAMILY_RECORD = '''\
    Family("smollm3", "SmolLM3", ("smollm3",), "Thm 7 + Thm 9 (outer weight)", "tiny-smollm3",
           "Llama's (no rotary in some layers)"),
'''


def follow_family(row: Row, repo: Path) -> None:
    """Do what one row of the family recipe says, for SmolLM3."""
    path = repo / row.file.replace("<family>", "smollm3")
    if row.file == "experiments/patching/arch/<family>.py":
        path.write_text(FAMILY_MODULE)
    elif row.file == "experiments/patching/families.py":
        text = path.read_text()
        assert "\n)\n\nDOC = " in text, "families.py has no FAMILY_TABLE = (...) closing before DOC to add a record to"
        path.write_text(text.replace("\n)\n\nDOC = ", f"\n{FAMILY_RECORD})\n\nDOC = ", 1))
    elif row.file == "docs/models.md":
        command = re.search(r"`(python -m [^`]+)`", row.what).group(1).split()
        subprocess.run([sys.executable, *command[1:]], cwd=repo, check=True, capture_output=True, env=_env(repo))
    else:
        raise AssertionError(f"the recipe has a step this test does not follow: {row.file} ({row.what})")


def test_following_the_family_recipe_is_all_a_new_family_needs(tmp_path):
    """In a copy of the tree, the recipe's files and nothing else: the family's tests (its record agrees with
    its adapter, the docs table is current, no list of the families is left stale) pass, its tiny model
    patches as the other families' do, and the export help names it."""
    repo = tmp_path / "repo"
    for part in ("cli", "experiments", "conf", "docs", "tests"):
        shutil.copytree(REPO_ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", repo)
    for row in recipe("add a model family").rows:
        follow_family(row, repo)
    assert "`tiny-smollm3`" in (repo / "docs" / "models.md").read_text()

    tests = ["tests/patching/test_family_table.py", "tests/patching/test_rules.py",
             "tests/patching/test_arch.py::test_patched_generation_without_the_context_emits_the_stock_with_context_tokens"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "pytest"), *tests, "-k", "not generation or smollm3"],
                          cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "tokens[tiny-smollm3] PASSED" in proc.stdout, proc.stdout[-3000:]  # it joined the families' tests
    helped = subprocess.run([sys.executable, "-m", "cli.main", "patch", "export", "--help"], cwd=repo,
                            env={**_env(repo), "COLUMNS": "400"}, capture_output=True, text=True, check=True).stdout
    assert "tiny-smollm3" in helped
    assert not (REPO_ROOT / "experiments" / "patching" / "arch" / "smollm3.py").exists()  # the real tree untouched
