"""Which causal-LM families of the installed transformers patch, and how: by an adapter file, by their module
tree (structure.py, confirmed by the check on a tiny random model of the family), or refused and why.

What a researcher asks before bringing a model (`icl-exp models`). A family with an adapter file is listed
from the file (its check runs on every load, and in the tests). Any other family is built from a tiny config
(tiny.py: written out or shrunk from the stock one), given seeded random weights, and its structural forms
are put to the float64 check in turn, as `load_model` would; what stops it is its line. The answers depend
on transformers and on this package's adapter code only, so they are cached under the project's cache dir
(`$ICL_EXP_CACHE/families/`), keyed by the transformers version and a hash of patching/arch/'s sources.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

BY_FILE, BY_STRUCTURE, REFUSED, NOT_CHECKED = "adapter file", "module tree", "refused", "not checked"
LIMIT_S = 30  # a family whose tiny model takes longer is listed as not checked (its kernels' reference paths)


@dataclass(frozen=True)
class FamilyStatus:
    model_type: str
    status: str  # BY_FILE | BY_STRUCTURE | REFUSED | NOT_CHECKED
    detail: str  # the family and its Table 1 rows, or why not, in one line


def causal_lm_types() -> list[str]:
    """Every model_type the installed transformers has a causal-LM class for, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def family_status(model_type: str) -> FamilyStatus:
    """One family's answer, computed now (seconds at most: a tiny model and its check)."""
    from experiments.core.errors import UserError, first_line
    from experiments.patching.arch import ADAPTERS
    from experiments.patching.arch.check import choose_adapter, describe
    from experiments.patching.arch.structure import CANNOT_BUILD, NoForm, candidates
    from experiments.patching.arch.tiny import tiny_config
    from experiments.zoo.tokenizer import byte_tokenizer

    if model_type in ADAPTERS:
        a = ADAPTERS[model_type]
        return FamilyStatus(model_type, BY_FILE, f"{a.family}: {a.theorem}")
    try:
        config = tiny_config(model_type, len(byte_tokenizer()))
    except Exception as err:
        return FamilyStatus(model_type, NOT_CHECKED, f"no tiny config could be made ({first_line(err)})")
    try:
        forms = candidates(config)
    except NoForm as why:
        if str(why).startswith(CANNOT_BUILD):  # the shrunk config's fault, not the family's
            return FamilyStatus(model_type, NOT_CHECKED, f"its tiny model could not be built ({why})")
        return FamilyStatus(model_type, REFUSED, str(why))
    if not forms:
        return FamilyStatus(model_type, REFUSED, "no form of Table 1 fits its module tree")
    try:
        model = _tiny_model(config, forms[0].load_kwargs)
    except Exception as err:
        return FamilyStatus(model_type, NOT_CHECKED, f"its tiny model could not be built ({first_line(err)})")
    try:
        chosen = choose_adapter(model, forms)
    except UserError as err:
        return FamilyStatus(model_type, REFUSED, _after_type(str(err)))
    return FamilyStatus(model_type, BY_STRUCTURE, describe(chosen))


def _tiny_model(config, load_kwargs: dict):
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.zoo.quiet import quiet_transformers
    from experiments.zoo.random_weights import randomize_

    torch.manual_seed(0)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_config(config, **load_kwargs)
    return randomize_(model, 0).eval().requires_grad_(False)


def _after_type(line: str) -> str:
    """The check's line without its leading "model_type 'x': " (the table names the type)."""
    return line.split(": ", 1)[1] if line.startswith("model_type ") else line


def cache_file() -> Path:
    import transformers

    from experiments.data.cache import cache_root

    sources = sorted(Path(__file__).parent.glob("*.py")) + sorted((Path(__file__).parents[1] / "rules").glob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    return cache_root() / "families" / f"transformers-{transformers.__version__}-{digest}.json"


def survey(model_types: list[str] | None = None, refresh: bool = False, progress=None) -> list[FamilyStatus]:
    """Each family's answer (every causal-LM type when `model_types` is None), from the cache where it has
    one; what is computed is added to the cache. `progress(model_type)` is called before each computation."""
    from experiments.core.atomic import write_json_atomic

    path = cache_file()
    cached = {} if refresh or not path.exists() else json.loads(path.read_text())
    out = []
    for t in model_types or causal_lm_types():
        if t not in cached:
            if progress:
                progress(t)
            cached[t] = asdict(_quietly(family_status, t))
        out.append(FamilyStatus(**cached[t]))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, cached)
    return out


class _TooLong(BaseException):  # not an Exception: the steps' own `except Exception` must let it through
    pass


def _quietly(fn, model_type: str) -> FamilyStatus:
    """`fn(model_type)` with transformers' and Python's warnings silenced (a tiny model of every family warns),
    stopped after LIMIT_S seconds where the platform has SIGALRM (the main thread of a Unix process)."""
    import signal
    import threading
    import warnings

    from experiments.zoo.quiet import quiet_transformers

    def stop(_signum, _frame):
        raise _TooLong

    timed = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGALRM, stop) if timed else None
    if timed:
        signal.alarm(LIMIT_S)
    try:
        with warnings.catch_warnings(), quiet_transformers():
            warnings.simplefilter("ignore")
            return fn(model_type)
    except _TooLong:
        return FamilyStatus(model_type, NOT_CHECKED, f"its tiny model's check took longer than {LIMIT_S} s")
    finally:
        if timed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, before)
