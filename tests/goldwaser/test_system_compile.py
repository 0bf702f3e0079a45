"""system_compile and `icl-exp patch compile method=analytic|bake`: the experiment's plumbing on a tiny random
model (its behaviour checks fail there, as they should: a random model follows no system prompt), the claims
failing on a broken compile, both checkpoints reloading in stock transformers and giving what the run measured,
the behaviour checks, the many-sequence fit, and bad input in one line before any model is loaded."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.helpers.cli import run_cli

EXPERIMENT = "system_compile"  # the shared smoke run (tests/helpers/smoke_runs.py)
SYSTEM = ("system=Begin every answer with the word 'Ahoy'.", "check=starts_with:Ahoy")
TINY = ("model=tiny-llama", "queries=[Hi?,Why?,How so?,What now?]", "heldout=2", "max_new_tokens=5",
        "rank=2", "steps=3", "batch=2")


# -- the shared smoke run -------------------------------------------------------------------------------
def test_smoke_run_measures_every_method_on_both_splits(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    per_query = m[m["metric"].isin(["kl", "top1", "behaviour", "prompted_reply_loglik"])]
    for method in ("control", "analytic", "bake"):
        for split in ("fit", "heldout"):
            rows = per_query[(per_query["method"] == method) & (per_query["split"] == split)]
            assert set(rows["metric"]) == {"kl", "top1", "behaviour", "prompted_reply_loglik"}, (method, split)
    assert set(m.loc[m["method"] == "reference", "metric"]) >= {"behaviour", "reference_s", "data_s"}
    # the analytic patch at its own fit positions: a construction (least squares, N below the hidden size)
    analytic = per_query[per_query["method"] == "analytic"]
    fit_kl = analytic[(analytic["split"] == "fit") & (analytic["metric"] == "kl")]
    assert fit_kl["value"].max() < 1e-8
    budget = m[m["metric"].isin(["rank", "params_factored", "params_changed", "compile_s"])]
    assert set(budget["method"]) == {"analytic", "bake"} and len(budget) == 8
    bake_rank = budget[(budget["method"] == "bake") & (budget["metric"] == "rank")]["value"]
    assert bake_rank.tolist() == [2.0]
    curve = m[m["metric"] == "bake_kl"].sort_values("step")
    assert curve["step"].tolist() == [1, 2, 3]
    curve = m[m["metric"] == "bake_eval_kl"]
    assert sorted(curve["step"]) == [0, 2, 3] and set(curve["split"]) == {"heldout"}
    claims = pd.read_csv(smoke_run / "claims.csv").set_index("id")
    for x in ("analytic", "bake"):  # measured, per system prompt; on random weights they may fail
        for kind in ("kl_below_control", "behaviour_above_control", "no_leak"):
            assert f"system_compile.heldout.ahoy.{x}_{kind}" in claims.index
    assert "system_compile.heldout.ahoy.bake_kl_below_analytic" in claims.index
    assert {"prompts_passed", "kl_ratio_geomean", "coherence_threshold", "check_agreement"} <= set(m["metric"])
    assert (smoke_run / "figures" / "heldout.png").is_file() and (smoke_run / "figures" / "bake_curve.png").is_file()
    assert (smoke_run / "figures" / "kl_vs_compile_s.png").is_file()
    generations = json.loads((smoke_run / "generations.json").read_text())
    assert set(generations["system"]["ahoy"]) == {"reference", "control", "analytic", "bake"}
    summary = (smoke_run / "summary.md").read_text()  # the per-behaviour table, from metrics.csv
    assert "| ahoy | analytic |" in summary and "| all | prompted (reference) |" in summary


def test_the_per_behaviour_table_counts_each_prompts_heldout_replies_and_leaves_out_the_budget_sweep():
    """Built by hand: two prompts, the analytic patch with a validation point beside its chosen one; the table's
    rates and intervals are the held-out replies' (Wilson by hand for 1 of 2), its KL the held-out mean, its
    compile figures the chosen point's."""
    from experiments.goldwaser.system_compile.table import markdown, summary_table

    rows = []
    for prompt, passes in (("french", (1, 0)), ("ahoy", (1, 1))):
        for q, ok in enumerate(passes):
            rows += [dict(metric="behaviour", value=ok, method="analytic", prompt=prompt, split="heldout", query=q),
                     dict(metric="kl", value=0.1 * (q + 1), method="analytic", prompt=prompt, split="heldout", query=q),
                     dict(metric="behaviour", value=0, method="control", prompt=prompt, split="heldout", query=q),
                     dict(metric="behaviour", value=1, method="analytic", prompt=prompt, split="fit", query=q)]
        rows += [dict(metric="compile_s", value=999.0, method="analytic", prompt=prompt, split="validation"),
                 dict(metric="compile_s", value=12.0, method="analytic", prompt=prompt, split=None)]
    table = summary_table(pd.DataFrame(rows)).set_index(["prompt", "method"])
    french = table.loc[("french", "analytic")]
    assert (french.passes, french.replies, french.compile_s) == (1, 2, 12.0)
    assert french.heldout_kl == pytest.approx(0.15)
    z2 = 1.959963984540054 ** 2  # Wilson's interval for 1 of 2, written out
    centre, half = (0.5 + z2 / 4) / (1 + z2 / 2), 1.959963984540054 * (0.25 / 2 + z2 / 16) ** 0.5 / (1 + z2 / 2)
    assert (french.lo, french.hi) == pytest.approx((centre - half, centre + half))
    assert (table.loc[("all", "analytic")].passes, table.loc[("all", "analytic")].replies) == (3, 4)
    assert table.loc[("all", "control")].passes == 0
    assert "| french | analytic | 0.15 |" in markdown(summary_table(pd.DataFrame(rows)))


def test_the_pareto_front_keeps_the_points_nothing_beats_on_both():
    from experiments.goldwaser.system_compile.plots import pareto

    assert pareto([(10, 0.5), (1, 0.9), (5, 0.95), (20, 0.1), (30, 0.2)]) == [(1, 0.9), (10, 0.5), (20, 0.1)]


# -- budgets: chosen on a validation split, the held-out queries touched once ----------------------------------
def test_a_budget_sweep_chooses_on_validation_queries_and_never_reads_the_heldout_ones(tmp_path, monkeypatch):
    """Every point of each method's grid is compiled without the validation query and scored on it; the point
    of lowest validation KL is compiled again on every fit query, and only it is measured on the held-out
    queries. A spy on the KL measure sees which queries each sweep evaluation reads."""
    from experiments.goldwaser.system_compile import study

    real, read = study.mean_kl, []

    def spy(ref, queries):
        read.append([ref.splits[i] for i in queries])
        return real(ref, queries)

    monkeypatch.setattr(study, "mean_kl", spy)
    from tests.helpers.in_process import run_claims

    run_claims(EXPERIMENT, tmp_path / "run", "validation=1", "analytic_ranks=[null,1]", "ridges=[0,0.5]",
               "bake_steps=[1,2]", "eval_every=1")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    val = m[m["metric"] == "validation_kl"]
    assert sorted(val.groupby("method")["budget_point"].nunique().items()) == [("analytic", 4), ("bake", 2)]
    assert set(m.loc[m["metric"] == "bake_eval_kl", "split"]) == {"validation"}  # the sweep's curves
    assert all(split == ["fit"] for split in read)  # the validation query is a fit query; never a held-out one
    heldout = m[(m["split"] == "heldout") & m["method"].isin(["analytic", "bake"])]
    assert set(heldout["metric"]) <= {"kl", "top1", "behaviour", "prompted_reply_loglik", "reply_loglik"}
    assert heldout["budget_point"].isna().all()
    for method, group in val.groupby("method"):
        best = group.sort_values("value").iloc[0]  # the smoke run's KLs are distinct: no tie to break
        final = m[(m["metric"] == "compile_s") & (m["method"] == method) & m["split"].isna()].iloc[0]
        for knob in ("budget_rank", "budget_ridge", "budget_steps"):
            assert (pd.isna(best[knob]) and pd.isna(final[knob])) or best[knob] == final[knob], (method, knob)


def test_the_choice_is_the_lowest_validation_kl_a_tie_to_the_faster_compile_and_nan_last():
    from experiments.goldwaser.system_compile.budgets import Point, choose

    a, b, c = Point("bake", 2, steps=1), Point("bake", 2, steps=2), Point("bake", 4, steps=2)
    assert choose([(a, 0.5, 1.0), (b, 0.2, 9.0), (c, 0.3, 2.0)]) == b
    assert choose([(a, 0.2, 3.0), (b, 0.2, 1.0)]) == b
    assert choose([(a, float("nan"), 0.1), (b, 0.9, 5.0)]) == b


# -- the claims can fail ----------------------------------------------------------------------------------
def test_a_compile_that_changes_nothing_fails_the_claims(tmp_path, monkeypatch):
    """The analytic patch's ΔW zeroed (the originals written back at once) and a bake with learning rate 0:
    both models are the unprompted one, so their held-out KL is the control's, ratio exactly 1."""
    import dataclasses

    from experiments.goldwaser.system_compile import study
    from tests.helpers.in_process import run_claims

    real_fit, real_bake = study.fit_patch, study.bake

    def zero_fit(*args, **kwargs):
        patch = real_fit(*args, **kwargs)
        patch.restore(args[0])
        return patch

    monkeypatch.setattr(study, "fit_patch", zero_fit)
    monkeypatch.setattr(study, "bake", lambda lm, data, s, *a: real_bake(lm, data, dataclasses.replace(s, lr=0.0), *a))
    claims = run_claims(EXPERIMENT, tmp_path / "broken")
    for x in ("analytic", "bake"):
        row = claims.loc[f"system_compile.heldout.ahoy.{x}_kl_below_control"]
        assert row["measured"] == 1.0 and not row["passed"]
    assert not claims.loc["system_compile.heldout.ahoy.bake_kl_below_analytic", "passed"]


def test_a_leaked_compile_fails_its_leak_claim_and_a_kl_of_zero_writes_the_claims(tmp_path, monkeypatch):
    """Both compiles made to do nothing and then measured as the stock model READING THE PROMPT (their plain
    input replaced by the prompted one): KL 0.000 on every held-out query. The KL claims pass on it (0 / control)
    and the leak claims fail; bake / analytic is 0 / 0 (no ZeroDivisionError); claims.csv and summary.md exist."""
    import dataclasses

    from experiments.goldwaser.system_compile import study
    from tests.helpers.in_process import run_claims

    real_fit, real_bake, real_measure = study.fit_patch, study.bake, study.measure_model

    def zero_fit(*args, **kwargs):
        patch = real_fit(*args, **kwargs)
        patch.restore(args[0])
        return patch

    def leaked(lm, ref, gen, log, generations=None, **index):
        if index["method"] in ("analytic", "bake"):
            ref = dataclasses.replace(ref, ids=[dataclasses.replace(i, plain=i.prompted) for i in ref.ids])
        return real_measure(lm, ref, gen, log, generations, **index)

    monkeypatch.setattr(study, "fit_patch", zero_fit)
    monkeypatch.setattr(study, "bake", lambda lm, data, s, *a: real_bake(lm, data, dataclasses.replace(s, lr=0.0), *a))
    monkeypatch.setattr(study, "measure_model", leaked)
    claims = run_claims(EXPERIMENT, tmp_path / "leak")
    for x in ("analytic", "bake"):
        assert claims.loc[f"system_compile.heldout.ahoy.{x}_kl_below_control", "measured"] == 0.0
        assert not claims.loc[f"system_compile.heldout.ahoy.{x}_no_leak", "passed"]
    assert not claims.loc["system_compile.heldout.ahoy.bake_kl_below_analytic", "passed"]
    assert (tmp_path / "leak" / "claims.csv").is_file() and (tmp_path / "leak" / "summary.md").is_file()


def test_the_compiled_model_never_sees_the_prompts_tokens(tmp_path, monkeypatch):
    """A spy on every input the compiled models are fed while they are measured (teacher-forced and generating):
    none holds the system prompt's tokens; the prompted reference's inputs, spied the same way, do."""
    from experiments.goldwaser.system_compile import study
    from experiments.zoo.tokenizer import byte_tokenizer
    from tests.helpers.in_process import run_claims

    system = list(byte_tokenizer()("Begin every answer", add_special_tokens=False)["input_ids"])
    seen: dict[str, list[list[int]]] = {}
    real_measure, real_reference = study.measure_model, study.reference

    def spy(method, lm):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids")
            if ids is not None:
                seen.setdefault(method, []).extend(ids.tolist())
        return lm.register_forward_pre_hook(hook, with_kwargs=True)

    def measure(lm, ref, gen, log, generations=None, **index):
        handle = spy(index["method"], lm)
        try:
            return real_measure(lm, ref, gen, log, generations, **index)
        finally:
            handle.remove()

    def reference(cfg, model, *args):
        handle = spy("reference", model)
        try:
            return real_reference(cfg, model, *args)
        finally:
            handle.remove()

    monkeypatch.setattr(study, "measure_model", measure)
    monkeypatch.setattr(study, "reference", reference)
    run_claims(EXPERIMENT, tmp_path / "spy")

    def holds(row: list[int]) -> bool:
        return any(row[i:i + len(system)] == system for i in range(len(row) - len(system) + 1))
    assert any(holds(row) for row in seen["reference"])
    for method in ("analytic", "bake"):
        assert seen[method] and not any(holds(row) for row in seen[method]), method


def test_the_bakes_compile_time_leaves_out_its_heldout_evaluations(tmp_path, monkeypatch):
    """A clock that moves only while the held-out KL is measured: the bake's compile_s is then 0 and its
    bake_eval_s carries every evaluation. eval_every=0 ("at the end only") still evaluates at the end."""
    import types

    from experiments.goldwaser.system_compile import study

    clock = [0.0]
    real = study.mean_kl

    def slow(ref, queries):
        measure = real(ref, queries)

        def timed(model):
            clock[0] += 1000.0
            return measure(model)
        return timed

    monkeypatch.setattr(study, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(study, "mean_kl", slow)
    from tests.helpers.in_process import run_claims

    run_claims(EXPERIMENT, tmp_path / "run", "methods=[bake]", "eval_every=0")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert m.loc[m["metric"] == "bake_eval_kl", "step"].tolist() == [3]  # steps=3 in the smoke preset
    bake = m[m["method"] == "bake"].set_index("metric")["value"]
    assert bake["compile_s"] == 0.0 and bake["bake_eval_s"] == 1000.0


# -- checkpoints ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["analytic", "bake"])
def test_patch_compile_writes_a_stock_checkpoint_that_gives_what_it_measured(tmp_path, method):
    from transformers import AutoModelForCausalLM

    from experiments.goldwaser.system_compile.replies import kl_rows
    from experiments.patching.load import load_checked

    out = tmp_path / method
    # the analytic one fitted on sampled continuations (two a fit query), truncated to rank 3 and regularized
    extra = ("continuations=sample", "samples=2", "analytic_rank=3", "ridge=0.1") if method == "analytic" else ()
    res = run_cli("patch", "compile", f"method={method}", *SYSTEM, *TINY, *extra, f"out={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    printed = res.stdout + res.stderr
    assert f"compiled checkpoint ({method}" in printed and "reloaded in stock transformers" in printed
    info = json.loads((out / "compiled.json").read_text())
    assert info["method"] == method and info["reload_logit_linf_rel"] == 0.0
    # stock transformers on the folder, fed each held-out query WITHOUT the system prompt, against the original
    # model given it (the tiny model is rebuilt from its seed): the KL the run measured, computed again here
    stock = AutoModelForCausalLM.from_pretrained(out).eval()
    base = load_checked("tiny-llama", seed=0).model
    kls = []
    with torch.no_grad():
        for q in info["queries"]:
            reply = q["reply_ids"]
            ref = base(torch.tensor([q["prompted_ids"] + reply[:-1]])).logits[0, -len(reply):]
            got = stock(torch.tensor([q["plain_ids"] + reply[:-1]])).logits[0, -len(reply):]
            kls.append(float(kl_rows(ref, got).mean()))
            out_ids = stock.generate(torch.tensor([q["plain_ids"]]), max_new_tokens=len(q["generation_ids"]),
                                     do_sample=False, pad_token_id=0)[0, len(q["plain_ids"]):].tolist()
            assert out_ids == q["generation_ids"][:len(out_ids)]  # a stop token may end stock's sooner
    assert kls == pytest.approx([q["kl"] for q in info["queries"]], rel=1e-5)
    assert sum(kls) / len(kls) == pytest.approx(info["heldout"]["kl"], rel=1e-5)
    assert info["control"]["kl"] > 0 and info["rank"] == (3 if method == "analytic" else 2)
    assert info["params_changed"] > 0
    claims = pd.read_csv(out / "claims.csv").set_index("id")
    assert bool(claims.loc["system_compile.checkpoint.reproduced", "passed"])
    assert bool(claims.loc["system_compile.checkpoint.same_generations", "passed"])


# -- bad input: one line, before any model is loaded -------------------------------------------------------
@pytest.mark.parametrize("override, said", [
    ("prompts=[]", "prompts= is empty"),
    ("queries=[]", "queries= is empty"),
    ("heldout=0", "no held-out query"),
    ("heldout=5", "leaves no query to fit on"),
    ("rank=0", "rank=0 must be at least 1"),
    ("steps=0", "steps=0 must be at least 1"),
    ("steps=-3", "steps=-3 must be at least 1"),
    ("analytic_rank=0", "analytic_rank=0 must be at least 1"),
    ("ridge=-1", "ridge=-1.0 must be 0"),
    ("steps=2.5", "steps=2.5 is ill-typed: expected an integer"),
    ("prompts=[{name:a,text:hi,check:loud}]", "check='loud' is not a behaviour check"),
    ("system=Be brief.", "system= needs check="),
    ("prompts=[{name:a,text:hi,check:frnech}]", "did you mean french?"),
    ("queries=[Hi?,Why?,How so?,hi?,\"  WHY? \"]", "held-out query 'hi?' repeats fit query 'Hi?'"),
    ("lora_targets=[q_lin]", "q_lin names no module of tiny-llama"),
    (("save=bake", "methods=[analytic]"), "save=bake is not among methods"),
    ("analytic_ranks=[null,2]", "2 budget points for analytic need validation=N"),
    (("validation=3",), "validation=3 leaves no fit query to compile on"),
    (("validation=1", "bake_steps=[0,2]"), "bake_steps=[0, 2] must hold positive integers"),
    (("validation=1", "ridges=[0,-1]"), "ridges=[0.0, -1.0] must be 0"),
    (("validation=1", "analytic_ranks=[2,2]"), "analytic's budget points repeat one another"),
])
def test_bad_input_is_one_line(tmp_path, override, said):
    from tests.helpers.in_process import refusal

    overrides = override if isinstance(override, tuple) else (override,)
    assert said in refusal(EXPERIMENT, tmp_path / "run", *overrides)


def test_a_model_without_a_chat_template_asked_for_a_system_turn(tmp_path):
    """A checkpoint folder with a config and a tokenizer but no weights: the refusal comes from the tokenizer,
    before anything tries to load the model."""
    from experiments.patching.load import offline_config
    from experiments.zoo.tokenizer import byte_tokenizer
    from tests.helpers.in_process import refusal

    folder = tmp_path / "plain-llama"
    offline_config("tiny-llama").save_pretrained(folder)
    tok = byte_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(folder)
    said = refusal(EXPERIMENT, tmp_path / "run", f"model={folder}")
    assert "has no chat template" in said and "template=prefix" in said


def test_patch_compile_method_needs_a_system_prompt(tmp_path):
    res = run_cli("patch", "compile", "method=bake", "model=tiny-llama", f"out={tmp_path / 'x'}")
    assert res.returncode == 2 and "give system=TEXT and check=" in res.stderr
    res = run_cli("patch", "compile", "method=lora", *SYSTEM, f"out={tmp_path / 'x'}")
    assert res.returncode == 2 and "method=lora is not one of analytic, bake" in res.stderr
    assert not (tmp_path / "x").exists()


# -- the pieces -------------------------------------------------------------------------------------------
def test_prompted_and_plain_inputs_share_the_query_at_their_end():
    from experiments.goldwaser.system_compile.inputs import encode
    from experiments.zoo.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    for template in ("chat", "prefix"):
        ids = encode(tok, template, "Q: {query}\nA:", "Be brief.", "Why?")
        assert ids.prompted[-ids.shared:] == ids.plain[-ids.shared:]
        assert len(tok.decode(ids.plain[-ids.shared:])) >= len("Why?")
        assert "Be brief." in tok.decode(ids.prompted) and "Be brief." not in tok.decode(ids.plain)


@pytest.mark.numeric
@pytest.mark.usefixtures("one_thread")
def test_fit_over_sequences_of_different_lengths_is_exact_at_their_rows():
    """Two sequences of different lengths in one right-padded batch: in float64, every aligned row's layer
    output becomes the target's (rows fewer than d, so least squares is exact), and the rows after a short
    sequence (padding) are not fitted; the unpatched model (control) is far from the targets."""
    from experiments.goldwaser.system_compile.analytic import FitSequence, fit_patch, fit_targets
    from experiments.patching.arch import adapter_for
    from experiments.patching.fixed_patch import layer_outputs
    from experiments.patching.load import load_checked

    model = load_checked("tiny-llama", torch.float64, seed=1).model
    adapter = adapter_for("llama")
    seqs = [FitSequence((2, 40, 41, 42, 43, 44, 45), (2, 44, 45), 2),
            FitSequence((2, 50, 51, 52, 53), (2, 60, 61, 52, 53), 3)]
    targets = fit_targets(model, adapter, seqs, "cpu")
    control = [layer_outputs(model, adapter, torch.tensor([s.plain]))[1] for s in seqs]
    patch = fit_patch(model, adapter, seqs, targets, pad_id=0)
    try:
        for layer in range(len(targets.out)):
            got = torch.cat([layer_outputs(model, adapter, torch.tensor([s.plain]))[1][layer][-s.aligned:]
                             for s in seqs])
            before = torch.cat([c[layer][-s.aligned:] for c, s in zip(control, seqs, strict=True)])
            want = targets.out[layer]
            assert float((got - want).abs().max() / want.abs().max()) < 1e-10
            assert float((before - want).abs().max() / want.abs().max()) > 1e-3
        assert patch.k == 5 and all(fit.rank == 5 for fit in patch.layers)
    finally:
        patch.restore(model)


def test_analytic_rank_truncates_every_matrix():
    from experiments.patching.lemmas_ls import truncate

    delta = torch.randn(6, 5, dtype=torch.float64) @ torch.randn(5, 7, dtype=torch.float64)
    assert int(torch.linalg.matrix_rank(truncate(delta, 2))) == 2
    assert torch.equal(truncate(delta, None), delta) and torch.equal(truncate(delta, 9), delta)


@pytest.mark.parametrize("text", ["Begin every answer with the word 'Ahoy'.", "a\\b \\'q", "x=1, [y] {z}", "end\\",
                                  'He said "hi"', "Reply in JSON: {\"a\": [1, 2]}"])
def test_patch_compile_hands_a_system_prompt_to_hydra_unchanged(text):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from cli.patch import hydra_quoted

    assert OverridesParser.create().parse_override(hydra_quoted(f"system={text}")).value() == text


# -- the real model -------------------------------------------------------------------------------------
@pytest.mark.slow  # about 2 min on 2 idle cores: Qwen2.5-Coder-0.5B-Instruct, loaded and saved (2.5 GB)
def test_qwen_ahoy_compiles_analytically_into_a_stock_checkpoint(tmp_path):
    """The trained model follows "Begin every answer with the word 'Ahoy'."; the analytic patch, fitted on 6
    queries' 12-token replies, brings the held-out next-token distributions close to the prompted model's
    (measured: KL 0.047 against the unprompted model's 2.2) and starts held-out answers with Ahoy where the
    unprompted model never does (measured: 1 of 2), and the reloaded checkpoint gives the run's logits."""
    from tests.helpers.bundled import require_bundled

    require_bundled("qwen2.5-0.5b")
    out = tmp_path / "ahoy"
    queries = "queries=[What is a closure?,Why is the sky blue?,What does HTTP stand for?,Explain recursion.," \
              "What is Git used for?,How do I merge two dictionaries?,What is a hash table?,What is an API?]"
    res = run_cli("patch", "compile", "method=analytic", *SYSTEM, "model=qwen2.5-0.5b", queries, "heldout=2",
                  "max_new_tokens=12", f"out={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads((out / "compiled.json").read_text())
    assert info["heldout"]["behaviour"] > info["control"]["behaviour"] == 0.0
    assert info["heldout"]["kl"] < 0.5 * info["control"]["kl"]
    assert info["fit"]["kl"] < 1e-8  # the construction, at the fit queries' own positions
    claims = pd.read_csv(out / "claims.csv").set_index("id")
    assert claims.loc[["system_compile.checkpoint.reproduced", "system_compile.checkpoint.same_generations"],
                      "passed"].all()


def test_reply_logits_of_a_float64_model_stay_float64():
    """The reload check compares logits at float64's rounding (1e-12): a float32 step would round them first."""
    from experiments.goldwaser.system_compile.replies import reply_logits
    from experiments.patching.load import load_checked

    for dtype, want in ((torch.float64, torch.float64), (torch.bfloat16, torch.float32)):
        model = load_checked("tiny-llama", dtype).model
        assert reply_logits(model, (1, 2, 3), [4, 5]).dtype == want


def test_the_chat_templates_default_system_prompt_is_refused_before_the_run(tmp_path):
    """Qwen's template puts its default system prompt in when none is given: compiling that prompt leaves the
    control equal to the reference (KL 0, a claim dividing by it); the tokenizer alone shows it."""
    from tests.helpers.bundled import require_bundled
    from tests.helpers.in_process import refusal

    require_bundled("qwen2.5-0.5b")
    said = refusal(EXPERIMENT, tmp_path / "run", "model=qwen2.5-0.5b",
                   "system='You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'", "check=french")
    assert "chat template default" in said and "\n" not in said
    assert not (tmp_path / "run").exists()
