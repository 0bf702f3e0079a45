"""The layers below the papers stay below them: read every module's imports (ast, nothing imported)
and fail on an import that climbs, or on a cycle among experiments.* modules.

Layers, bottom up (experiments/zoo/__init__.py says why): core and data; zoo (models, tokenizers,
prompts); patching (context -> weights, the architecture adapters); the papers (dherin, goldwaser,
karbevski, xu_fang). Imports inside functions count too: a lazy import is still a dependency, and the
cycle gemma_models <-> patch_models that this test was written against was one. No exception: what patching
knows about loading reaches the zoo as an argument (zoo/catalog.py), not an import.
Last, an experiment that is a package declares itself in an __init__.py that imports nothing heavy
(checked in a fresh interpreter).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ("dherin", "goldwaser", "karbevski", "xu_fang")
# package -> the experiments.* packages its modules may import (itself included)
ALLOWED = {
    "zoo": ("core", "data", "zoo"),
    "patching": ("core", "data", "zoo", "patching"),
}
# importer -> what it may import from a layer above, inside a function only (never at import time): none today
# (zoo/architectures.py's window onto patching.arch was the last; the zoo takes a Catalog instead)
LAZY_WINDOWS: dict[str, tuple[str, ...]] = {}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under experiments/, by dotted name."""
    return {module_name(p, root): p for p in sorted((root / "experiments").rglob("*.py"))}


def imports(path: Path, name: str, known: set[str], type_only: bool = False) -> dict[str, bool]:
    """The experiments.* modules `path` imports anywhere in its body (`from pkg import mod` names mod),
    each with True when one of its imports runs at import time (outside any function); with `type_only`, the
    imports under `if TYPE_CHECKING:` too (as inside a function: they never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, bool] = {}

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            if type_only:  # a type hint names the module all the same: a dependency of the design
                for child in node.body:
                    visit(child, True)
            return  # imports for type hints only never run: not a dependency at run time
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in names:
            if target == "experiments" or target.startswith("experiments."):
                found[target] = found.get(target, False) or not in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def import_graph(root: Path = ROOT, type_only: bool = False) -> dict[str, dict[str, bool]]:
    """importer -> {imported: at import time?} over every module under experiments/ (`type_only`: `imports`)."""
    mods = modules(root)
    known = set(mods)
    graph = {name: imports(path, name, known, type_only) for name, path in mods.items()}
    for name, targets in graph.items():
        targets.pop(name, None)
    return graph


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {name: set(targets) for name, targets in import_graph(root).items()}


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Every dependency one module has on another: its imports anywhere, type-only ones included, and the
    package `__init__`s an import from outside a package runs first (importing patching.arch.base from
    capture.py runs patching/arch/__init__.py). A cycle here is a circle in the design even where Python
    happens to import it (a type hint, a lazy import), and what a new import at module level would break."""
    edges = {name: set(targets) for name, targets in import_graph(root, type_only=True).items()}
    for importer, targets in edges.items():
        for target in list(targets):
            parts = target.split(".")
            for i in range(2, len(parts)):
                package = ".".join(parts[:i])
                if package in edges and not (importer + ".").startswith(package + "."):
                    targets.add(package)
        targets.discard(importer)
    return edges


def upward_imports(edges: dict[str, dict[str, bool]]) -> list[str]:
    """`importer -> imported` for each import out of its layer (ALLOWED), but a LAZY_WINDOWS import made
    inside a function."""
    bad = []
    for importer, targets in sorted(edges.items()):
        layer = importer.split(".")[1] if importer.count(".") else ""
        if layer not in ALLOWED:
            continue
        for target, at_import in sorted(targets.items()):
            package = target.split(".")[1] if target.count(".") else ""
            window = any(target == w or target.startswith(w + ".") for w in LAZY_WINDOWS.get(importer, ()))
            if package and package not in ALLOWED[layer] and (at_import or not window):
                bad.append(f"{importer} -> {target}")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_zoo_and_patching_import_nothing_above_them():
    bad = upward_imports(import_graph())
    assert not bad, "imports that climb out of their layer:\n" + "\n".join(bad)


def test_no_import_cycle_among_experiments_modules():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_cycle_in_the_package_graph():
    """Type hints and lazy imports count, and so does the package a module sits in: patching/'s capture hooks
    and rules once named the adapters' class for a type hint, a circle of ten modules (patching/block.py)."""
    found = cycles(package_graph())
    assert not found, "import cycles, type-only imports and packages included:\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_a_type_only_circle_is_found(fake_tree):
    """The control: the circle patching/ had, through a type hint and a package's __init__.py."""
    root = fake_tree({
        "patching/capture.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from experiments.patching.arch.base import BlockAdapter\n",
        "patching/arch/base.py": "from experiments.patching.rules import OutputRule\n",
        "patching/rules/__init__.py": "from experiments.patching.rules.base import OutputRule\n",
        "patching/rules/base.py": "from experiments.patching.capture import last_position\n",
    })
    assert cycles(graph(root)) == []  # what Python runs: no cycle
    assert cycles(package_graph(root)) == [["experiments.patching.arch.base", "experiments.patching.capture",
                                            "experiments.patching.rules", "experiments.patching.rules.base"]]


@pytest.fixture
def fake_tree(tmp_path: Path):
    """A throwaway experiments/ package with the given modules' sources."""

    def make(sources: dict[str, str]) -> Path:
        for rel, text in sources.items():
            path = tmp_path / "experiments" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in [path.parent, *path.parent.parents]:
                if parent == tmp_path:
                    break
                (parent / "__init__.py").touch()
            path.write_text(text)
        return tmp_path

    return make


def test_the_checks_can_fail(fake_tree):
    """The control: a climbing import and a lazy cycle, as on main before the zoo moved, are caught."""
    root = fake_tree({
        "zoo/loading.py": "from experiments.core.errors import UserError\n",
        "patching/export.py": "from experiments.goldwaser.gemma_models import encode_prompt\n",
        "goldwaser/gemma_models.py": "def load():\n    from experiments.goldwaser.patch_models import load_model\n",
        "goldwaser/patch_models.py": "from experiments.goldwaser import gemma_models\n",
        "zoo/gguf.py": "from . import loading\nfrom ..patching.arch import ADAPTERS\n",
        "patching/arch/__init__.py": "",
        # the window zoo/architectures.py was: a lazy import inside a function climbs all the same
        "zoo/architectures.py": "def known():\n    from experiments.patching.arch import ADAPTERS\n",
    })
    edges = import_graph(root)
    assert upward_imports(edges) == ["experiments.patching.export -> experiments.goldwaser.gemma_models",
                                     "experiments.zoo.architectures -> experiments.patching.arch",
                                     "experiments.zoo.gguf -> experiments.patching.arch"]
    assert cycles(graph(root)) == [["experiments.goldwaser.gemma_models", "experiments.goldwaser.patch_models"]]
    assert zoo_imports_of_patching(root) == ["experiments.zoo.architectures -> experiments.patching.arch",
                                             "experiments.zoo.gguf -> experiments.patching.arch"]


def zoo_imports_of_patching(root: Path = ROOT) -> list[str]:
    """`importer -> imported` for each import of experiments.patching by a file of experiments/zoo: anywhere in
    its body, inside functions and under TYPE_CHECKING included."""
    found = []
    for name, targets in sorted(import_graph(root, type_only=True).items()):
        if name == "experiments.zoo" or name.startswith("experiments.zoo."):
            found += [f"{name} -> {t}" for t in sorted(targets)
                      if t == "experiments.patching" or t.startswith("experiments.patching.")]
    return found


def test_the_zoo_imports_nothing_from_patching():
    """The loader that checks a model against patching lives in patching (patching/load.py) and hands the zoo a
    Catalog (zoo/catalog.py): no file of the zoo names patching, not even lazily (the control: above)."""
    assert {p.name for p in (ROOT / "experiments" / "zoo").glob("*.py")} >= {"loading.py", "catalog.py"}
    assert zoo_imports_of_patching() == []


def test_patchings_package_graph_is_acyclic():
    """patching/ alone: no circle among its modules and packages (type hints, lazy imports and the package
    __init__s an import runs included). The control is test_a_type_only_circle_is_found's circle."""
    edges = {name: {t for t in targets if t.startswith("experiments.patching")}
             for name, targets in package_graph().items() if name.startswith("experiments.patching")}
    assert len(edges) > 30  # every module of patching/ is in the graph
    assert cycles(edges) == []


# gemma_match is patch_match with Gemma 3's defaults (GemmaMatchConfig subclasses PatchMatchConfig):
# the same experiment under a second name, not a borrowing
SAME_EXPERIMENT = {("experiments.goldwaser.gemma_match", "experiments.goldwaser.patch_match"),
                   # bf16_ways draws its table with patch_match's ways_table: a borrowing this check did not see
                   # while that lived in patch_match_plots.py, a file of no experiment; kept as it was
                   ("experiments.goldwaser.bf16_ways", "experiments.goldwaser.patch_match")}


def owner(module: str, experiment_modules: set[str]) -> str | None:
    """The experiment a module belongs to: itself, or the package experiment it sits in (patch_match/run.py
    is patch_match's), so a borrowing from a package's run.py or plots.py counts as one."""
    return next((e for e in experiment_modules if module == e or module.startswith(e + ".")), None)


def sideways_imports(edges: dict[str, set[str]], experiment_modules: set[str]) -> list[str]:
    """`importer -> imported` where one experiment's module imports another's: what they share belongs in a
    module of its own (goldwaser/common.py, patching/compare.py), not in one of them."""
    found = []
    for a, targets in edges.items():
        mine = owner(a, experiment_modules)
        for b in targets:
            theirs = owner(b, experiment_modules)
            if mine and theirs and mine != theirs and (mine, theirs) not in SAME_EXPERIMENT:
                found.append(f"{a} -> {b}")
    return sorted(found)


def test_experiments_do_not_borrow_from_one_another():
    from experiments.core.registry import _module_name, experiment_names

    found = sideways_imports(graph(), {_module_name(n) for n in experiment_names()})
    assert not found, "experiments importing one another:\n" + "\n".join(found)
    # the control: what context_compile did before goldwaser/common.py
    edges = {"experiments.goldwaser.context_compile": {"experiments.goldwaser.patch_match"}}
    assert sideways_imports(edges, {*edges, "experiments.goldwaser.patch_match"}) == [
        "experiments.goldwaser.context_compile -> experiments.goldwaser.patch_match"]
    # and into a package experiment's modules, which the registry names by the package alone
    edges = {"experiments.goldwaser.layer_errors.run": {"experiments.goldwaser.patch_match.plots"}}
    assert sideways_imports(edges, {"experiments.goldwaser.layer_errors", "experiments.goldwaser.patch_match"}) == [
        "experiments.goldwaser.layer_errors.run -> experiments.goldwaser.patch_match.plots"]


# -- a package experiment's declaration ----------------------------------------------------------------
HEAVY = ("torch", "transformers", "pandas", "numpy", "matplotlib", "omegaconf")


def heavy_imports(modules: list[str]) -> list[str]:
    """The HEAVY packages that importing `modules` pulls in, in a fresh interpreter (this one has them all)."""
    code = ("import importlib, sys; [importlib.import_module(m) for m in sys.argv[2:]]; "
            "print(','.join(m for m in sys.argv[1].split(',') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, ",".join(HEAVY), *modules], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def test_a_package_experiments_declaration_imports_nothing_heavy():
    """Every experiment is a package whose __init__.py, its home, holds its config class, presets and
    EXPERIMENT, and imports run.py, claims.py and plots.py only when run, plot or validate is called: `icl-exp
    list`, every composition (which stores the config classes) and the registry's get() must not wait for
    torch, nor for omegaconf (the config classes write its MISSING themselves)."""
    from experiments.core.registry import _module_name, experiment_names

    packages = [m for m in map(_module_name, experiment_names())
                if (ROOT / Path(*m.split(".")) / "__init__.py").is_file()]
    assert len(packages) == len(experiment_names())
    assert heavy_imports(packages) == []
    # the control: the run module behind a declaration does pull torch in
    assert "torch" in heavy_imports(["experiments.goldwaser.patch_match.run"])


def later_targets(experiment) -> list[tuple[str, str]]:
    """(module, function) of each of a declaration's run, plot and validate given as `registry.Later`: what
    nothing imports until a run or a plot."""
    from experiments.core.registry import Later

    fns = (experiment.run, experiment.plot, experiment.validate)
    return [(f.module, f.function) for f in fns if isinstance(f, Later)]


def missing(targets: list[tuple[str, str]]) -> list[str]:
    """`module:name` of each target whose module, imported in a fresh interpreter, has no such name."""
    code = ("import importlib, sys; pairs = [a.split(':') for a in sys.argv[1:]]; "
            "print(' '.join(f'{m}:{n}' for m, n in pairs if not hasattr(importlib.import_module(m), n)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *(f"{m}:{n}" for m, n in targets)], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.split()


def test_a_package_experiments_lazy_imports_resolve():
    """What the registry's convention names for each experiment's run, plot and validate exists (a name moved
    between run.py and plots.py would otherwise show only when an experiment is run or plotted)."""
    from experiments.core.registry import all_experiments, experiment_names

    targets = sorted({t for exp in all_experiments() for t in later_targets(exp)})
    assert len(targets) == 3 * len(experiment_names())  # run, plot and validate of each, all by convention
    assert missing(targets) == []
    # the control: a name plots.py does not have (plot_all, its name before the convention: the slip this test
    # was written after)
    assert missing([("experiments.goldwaser.context_compile.plots", "plot_all")]) == [
        "experiments.goldwaser.context_compile.plots:plot_all"]
