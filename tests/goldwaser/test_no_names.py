"""The papers' code asks a variant or a family what it is, never what it is called (docs/design.md: the engine
never branches on a name; tests/patching/test_rules.py checks patching/ for the rules' names). Here: no string
literal in experiments/goldwaser/ is a variant's name (patching/variants.py's VARIANTS), a family's name or one
of its model types (patching/families.py), but in the table of the paper's own numbers (goldwaser/paper.py),
keyed by the variant the paper measured. A claim's id names its variant through a variable, as it is."""

from __future__ import annotations

import ast
from pathlib import Path

from experiments.patching.families import FAMILY_TABLE
from experiments.patching.variants import VARIANTS
from tests.helpers.repo import REPO_ROOT

GOLDWASER = REPO_ROOT / "experiments" / "goldwaser"
REGISTRIES = {"paper.py"}  # the paper's numbers by the variant it measured
NAMES = {*VARIANTS, *(f.name for f in FAMILY_TABLE), *(t for f in FAMILY_TABLE for t in f.model_types)}


def named(root: Path, names: set[str]) -> list[str]:
    """`file:line: 'name'` for each string literal in `root`'s modules that is one of `names`, outside
    REGISTRIES (a docstring is prose, and not a literal that could be compared)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in REGISTRIES:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{rel}:{n.lineno}: {n.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                  and isinstance(n.value, str) and n.value in names and id(n) not in docs]
    return found


def test_no_variant_or_family_is_told_apart_by_its_name():
    assert named(GOLDWASER, NAMES) == []


def test_a_name_written_out_is_found(tmp_path):
    """The controls: what layer_errors' claims and patch_match's MoE claim did before they asked the registry."""
    (tmp_path / "claims.py").write_text('def f(m, variants):\n    """naive"""\n'
                                        '    if "closed_loop" in variants:\n        pass\n'
                                        '    return m["family"].iloc[0] == "Mixtral"\n')
    assert named(tmp_path, NAMES) == ["claims.py:3: 'closed_loop'", "claims.py:5: 'Mixtral'"]


def test_the_papers_numbers_are_keyed_by_registered_variants():
    from experiments.goldwaser.paper import PAPER_BF16_MATCH

    assert set(PAPER_BF16_MATCH) <= set(VARIANTS)
