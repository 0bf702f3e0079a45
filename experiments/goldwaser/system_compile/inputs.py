"""The token ids of a query with the system prompt (what the reference reads) and without it (what the
compiled model and the control read), the split into fit and held-out queries, and the checks that need
only the tokenizer (a chat template with a system turn), all before a model is loaded.

template=chat: the model's chat template with a system turn and a user turn, against the user turn alone
(a template may put its own default system prompt there: Qwen's does, and that is what a user without a
system prompt gets). template=prefix (a base model): BOS, the system prompt, a blank line and the query in
`query_format`, against BOS and the query alone. Both end with the same tokens (the query, the assistant
turn's opening): `shared` counts them, so the two sequences' positions can be aligned from the end."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.errors import UserError, first_line
from experiments.goldwaser.common import text_list
from experiments.goldwaser.system_compile.duplicates import near_duplicates
from experiments.goldwaser.system_compile.schema import SystemCompileConfig

SYSTEM_MARKER = "SYSTEM-PROMPT-MARKER-7f3a"  # rendered to see whether a template keeps a system turn


@dataclass(frozen=True)
class QueryIds:
    """One query's token ids, with and without the system prompt, and what they share at their end."""

    query: str
    prompted: tuple[int, ...]  # system prompt + query, ready for the reply
    plain: tuple[int, ...]  # the query alone: what the compiled model is fed
    shared: int  # the length of their longest common suffix (≥ 1: at least the reply's first input)


def query_list(cfg: SystemCompileConfig) -> list[str]:
    """`queries`: a list, or a text file with one query a line."""
    queries = text_list(cfg.queries, "queries", "query")
    if not isinstance(queries, (list, tuple)):
        raise UserError("queries= must be a list like [a,b] or a path to a text file")
    queries = [str(q) for q in queries]
    if not queries or any(not q.strip() for q in queries):
        raise UserError("queries= is empty or holds an empty query: the compiled prompt needs user queries")
    return queries


def split(cfg: SystemCompileConfig) -> tuple[list[str], list[str]]:
    """(fit queries, held-out queries): the last `heldout` are held out."""
    queries, n = query_list(cfg), cfg.heldout
    if n < 1:
        raise UserError(f"heldout={n}: the split has no held-out query (heldout must be at least 1)")
    if n >= len(queries):
        raise UserError(f"heldout={n} leaves no query to fit on ({len(queries)} queries; heldout ≤ {len(queries) - 1})")
    fit, held = queries[:-n], queries[-n:]
    refuse_near_duplicates(fit, held, max(0, min(cfg.validation, len(fit))))
    return fit, held


def refuse_near_duplicates(fit: list[str], held: list[str], validation: int) -> None:
    """One line naming the first pair of queries that mean the same (duplicates.py: case, spaces,
    punctuation, contractions, zero-width characters, a typing slip), wherever they are: a held-out query equal
    to a fit one measures the fit, two equal held-out queries count one reply twice, and a repeated fit query
    weighs one query double."""
    groups = {"fit": fit[:len(fit) - validation], "validation": fit[len(fit) - validation:], "held-out": held}
    pairs = near_duplicates(groups)
    if pairs:
        r1, q1, r2, q2 = pairs[0]
        raise UserError(f"{r2} query {q2!r} repeats {r1} query {q1!r} (the same after case, spaces, punctuation "
                        f"and contractions; {len(pairs)} such pair{'s' * (len(pairs) != 1)}): give distinct queries")


def check_not_default(ids: QueryIds, name: str, model: str) -> None:
    """The prompted and plain inputs differ: a system prompt equal to the template's default one (what the
    model gets without a system turn) has nothing to compile, and the control's KL would be 0."""
    if ids.prompted == ids.plain:
        raise UserError(f"system prompt {name!r} is model={model}'s chat template default (what it gets without a "
                        "system turn): nothing to compile, the control already has it; give another prompt")


def check_template(tokenizer, template: str, model: str) -> None:
    """template=chat needs a chat template that renders a system turn: one line otherwise."""
    if template != "chat":
        return
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"model={model} has no chat template, so it has no system turn: use template=prefix "
                        "(the system prompt as text before the query)")
    try:
        text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM_MARKER},
                                              {"role": "user", "content": "hello"}],
                                             tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja's raise_exception: "System role not supported"
        raise UserError(f"model={model}'s chat template refuses a system turn ({first_line(err)}): "
                        "use template=prefix") from None
    if SYSTEM_MARKER not in text:
        raise UserError(f"model={model}'s chat template drops the system turn: use template=prefix")


def _text(tokenizer, template: str, query_format: str, system: str | None, query: str) -> str:
    if template == "chat":
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        messages.append({"role": "user", "content": query})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    body = query_format.replace("{query}", query)
    return (tokenizer.bos_token or "") + (f"{system}\n\n{body}" if system is not None else body)


def common_suffix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def encode(tokenizer, template: str, query_format: str, system: str, query: str) -> QueryIds:
    def ids(s: str | None) -> tuple[int, ...]:
        text = _text(tokenizer, template, query_format, s, query)
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompted, plain = ids(system), ids(None)
    return QueryIds(query, prompted, plain, max(common_suffix(prompted, plain), 1))
