"""patching/families.py is the one list of families and the one place each family's name, model types, theorem
and tiny model are written: each adapter file takes them from its record (none writes them again), every
adapter file has a record, the post-norm flag agrees with the adapter's own fields, and what lists the
families (docs/models.md's table, the export help, a sweep's model=) is made from it, so that adding a family
edits its adapter file and its record only."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from importlib import import_module
from pathlib import Path

import pytest

from experiments.patching import families
from experiments.patching.arch import FAMILIES
from experiments.patching.families import FAMILY_TABLE, MARKERS, Family, documented, markdown, tiny_models
from tests.helpers.repo import REPO_ROOT

ARCH = REPO_ROOT / "experiments" / "patching" / "arch"


def disagreements(record: Family) -> list[str]:
    """The fields `record` restates that its adapter file says otherwise."""
    adapter = import_module(f"experiments.patching.arch.{record.module}").ADAPTER
    said = {"name": adapter.family, "model_types": adapter.model_types, "theorem": adapter.theorem,
            "tiny_model": adapter.tiny_model, "post_norm": adapter.post_norm_block}
    return [f"{record.module}: {k} is {v!r} in the adapter, {getattr(record, k)!r} in the table"
            for k, v in said.items() if getattr(record, k) != v]


def test_each_record_says_what_its_adapter_file_says():
    assert [d for record in FAMILY_TABLE for d in disagreements(record)] == []
    assert [a.family for a in FAMILIES] == [f.name for f in FAMILY_TABLE]  # arch.FAMILIES is read in table order


def test_a_record_that_differs_from_its_adapter_is_named():
    wrong = replace(FAMILY_TABLE[0], model_types=("gemma3_text",), post_norm=False)
    assert disagreements(wrong) == [
        "gemma3: model_types is ('gemma3_text', 'gemma3') in the adapter, ('gemma3_text',) in the table",
        "gemma3: post_norm is True in the adapter, False in the table"]


def test_no_adapter_file_writes_what_its_record_holds():
    """An adapter file names its record (`said_by`) instead of writing family, model_types, theorem or tiny_model
    again: a second copy could drift from the first."""
    files = [p for p in ARCH.glob("*.py") if re.search(r"^ADAPTER = ", p.read_text(), re.M)]
    assert files
    restated = [f"{p.name}: {m.group(0)}" for p in files
                for m in re.finditer(r"\b(family|model_types|theorem|tiny_model)=[\"(]", p.read_text())]
    assert restated == []
    assert all(f'said_by("{p.stem}")' in p.read_text() for p in files)


def test_a_record_whose_post_norm_flag_is_wrong_is_refused_on_import():
    from experiments.patching.arch import _collect

    with pytest.raises(ImportError, match="gemma3's record says post_norm=False"):
        _collect(replace(FAMILY_TABLE[0], post_norm=False))


def test_every_adapter_file_has_a_record():
    """An adapter file without a record would be loaded by nothing: its family silently read from its tree."""
    files = {p.stem for p in ARCH.glob("*.py") if re.search(r"^ADAPTER = ", p.read_text(), re.M)}
    assert files == {f.module for f in FAMILY_TABLE}
    assert len({f.tiny_model for f in FAMILY_TABLE}) == len(FAMILY_TABLE)


def test_the_docs_table_is_the_generated_one():
    """docs/models.md's "Adapters today" is `python -m experiments.patching.families --write`'s output."""
    text = families.DOC.read_text()
    assert documented(text) == markdown(), "stale: run python -m experiments.patching.families --write"
    stale = text.replace("| `tiny-gptj` |", "| `tiny-gpt-j` |")  # the control: an edited row is seen
    assert documented(stale) != markdown() and documented(families.with_table(stale)) == markdown()
    assert documented("no markers") == ""


def test_the_table_and_the_export_help_need_no_torch():
    """`icl-exp patch export --help` lists the families from the table without importing torch."""
    code = ("import sys, cli.patch; assert 'torch' not in sys.modules; "
            "print(cli.patch.EXPORT_HELP)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ", ".join(tiny_models()) in out.stdout and "post-norm blocks: Gemma 3, OLMo 2" in out.stdout
    tiny = subprocess.run([sys.executable, "-m", "experiments.patching.families", "--tiny"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert tiny.stdout.strip() == ",".join(tiny_models())  # what patch_match.yaml's sweep example runs


# Records, not lists to keep current: what a past run ran (report-generated results, the papers page drawn from
# results/, measured benchmarks and the Table 1 sweep as it was run). The family table names every tiny model itself.
RECORDS = {"docs/results.md", "docs/papers.md", "docs/benchmarks.md", "docs/goldwaser.md",
           "experiments/patching/families.py"}


def hand_lists(root: Path, names: tuple[str, ...]) -> list[str]:
    """Where 4 or more of `names` are written within 3 lines (outside the generated docs block): a list of the
    families by hand, which a new family would leave stale."""
    found = []
    for path in sorted([*root.glob("cli/**/*.py"), *root.glob("experiments/**/*.py"), *root.glob("conf/**/*.yaml"),
                        *root.glob("docs/*.md")]):
        rel = path.relative_to(root).as_posix()
        if rel in RECORDS:
            continue
        text = path.read_text()
        if MARKERS[0] in text:
            text = text.split(MARKERS[0], 1)[0] + text.split(MARKERS[1], 1)[-1]
        lines = text.splitlines()
        for i in range(len(lines)):
            if len({n for n in names if re.search(rf"{re.escape(n)}(?![\w-])", "\n".join(lines[i:i + 3]))}) >= 4:
                found.append(f"{rel}:{i + 1}")
                break
    return found


def test_no_other_file_lists_the_families_by_hand():
    assert hand_lists(REPO_ROOT, tiny_models()) == []


@pytest.mark.parametrize("where", ["cli/x.py", "conf/experiment/x.yaml", "docs/x.md"])
def test_a_hand_list_is_found(tmp_path, where):
    """The control: a list written out by hand in a comment, help text or doc is named."""
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_text("# sweep:\n#   model=tiny-gemma3,tiny-llama,\n#     tiny-gpt2,tiny-mixtral\n")
    assert hand_lists(tmp_path, tiny_models()) == [f"{where}:1"]
