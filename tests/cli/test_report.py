"""`icl-exp report`: the newest complete run per experiment, sweeps, bad input, --strict, the results page."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from experiments.core.report.collect import build_report  # noqa: E402
from experiments.core.report.markdown import render_markdown  # noqa: E402
from experiments.core.report.page import render_html  # noqa: E402
from experiments.core.report.results_page import render_results_page  # noqa: E402
from experiments.core.report.write import write_report  # noqa: E402
from experiments.core.results import CHECK_COLUMNS  # noqa: E402  (claims.csv as written before `measure`)
from tests.helpers.browser import find_browser, screenshot_html  # noqa: E402
from tests.helpers.cli import run_cli  # noqa: E402


def claim(id, measured, passed, comparison="<=", tolerance=1.0, paper_value=None):
    return dict(id=id, ref="Ref §1", description="what it checks", paper_value=paper_value, measured=measured,
                tolerance=tolerance, comparison=comparison, passed=passed)


def make_run(folder: Path, experiment: str, start: str, claims=None, status="complete", preset="cpu",
             figure=False) -> Path:
    folder.mkdir(parents=True)
    record = dict(experiment=experiment, status=status, start=start, preset=preset, run_id=folder.name)
    if status == "failed":
        record["error"] = "RuntimeError: boom"
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "metrics.csv").write_text("experiment,run_id,metric,value\n")
    if claims is not None:
        pd.DataFrame(claims, columns=CHECK_COLUMNS).to_csv(folder / "claims.csv", index=False)
    if figure:
        (folder / "figures").mkdir()
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([0, 1, 2], [1, 0, 2])
        fig.savefig(folder / "figures" / "fig.png", dpi=100)
        plt.close(fig)
    return folder


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    make_run(root / "linreg_icl" / "old", "linreg_icl", "2026-01-01T00:00:00",
             [claim("dherin.fig2.patch_equals_context", 5.0, False)])
    make_run(root / "linreg_icl" / "new", "linreg_icl", "2026-01-02T00:00:00",
             [claim("dherin.fig2.patch_equals_context", 1e-8, True, paper_value=1e-7)], figure=True)
    make_run(root / "linreg_icl" / "newest_failed", "linreg_icl", "2026-01-03T00:00:00", status="failed")
    sweep = root / "cov_rate" / "multirun" / "s1"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, slope in (("0", -1.02), ("1", -0.7)):
        make_run(sweep / job, "cov_rate", "2026-01-02T00:00:0" + job,
                 [claim("xu_fang.thm3_6.rate_slope", slope, abs(slope + 1) <= 0.1, "within", 0.1, -1.0)])
    make_run(root / "factorization" / "x", "factorization", "2026-01-02T00:00:00", status="failed")
    return root


def test_newest_complete_run_sweeps_failed_and_missing(results):
    rep = build_report(results)
    by_id = rep.claims.set_index(["id", "job"])
    assert by_id.loc[("dherin.fig2.patch_equals_context", ""), "run"] == "linreg_icl/new"  # not old, not failed
    assert sorted(rep.claims[rep.claims.experiment == "cov_rate"].job) == ["0", "1"]  # both jobs of the sweep
    assert rep.n_failed_claims == 1  # job 1's slope
    assert {r.experiment for r in rep.failed} == {"factorization"}  # no complete run: listed as failed
    assert "multilayer_ln" in rep.missing and "linreg_icl" not in rep.missing
    assert rep.problems == []
    md = render_markdown(rep)
    assert "## Dherin et al. — 1/1 claims passed" in md and "## Xu & Fang" in md
    assert md.index("## Dherin et al.") < md.index("## Xu & Fang")  # registry.PAPER_PACKAGES order
    assert "**not complete**: factorization" in md and "RuntimeError: boom" in md
    assert "| 1e-08 | ≤ 1 | pass |" in md and "within ±0.1" in md
    page = render_html(rep)
    assert page.count("data:image/png;base64,") == 1 and "<table>" in page
    all_runs = build_report(results, all_runs=True)
    assert len(all_runs.claims) == 4 and len(all_runs.failed) == 2


def test_bad_input_is_one_line_each_and_the_rest_is_written(results, tmp_path):
    corrupt = make_run(results / "cov_alignment" / "a", "cov_alignment", "2026-01-02T00:00:00", [])
    (corrupt / "claims.csv").write_bytes(b'id,ref,"unterminated\n\x00\xff\xfe')
    truncated = make_run(results / "cov_icl_gd" / "a", "cov_icl_gd", "2026-01-02T00:00:00",
                         [claim("xu_fang.cor4_1.single_head_cos", 0.99, True, ">=", 0.9)])
    text = (truncated / "claims.csv").read_text()
    (truncated / "claims.csv").write_text(text + "xu_fang.cor4_1.single_head_rate,Ref,desc,-1.0,-0.98,0.1,wit")
    legacy = make_run(results / "markov_collapse" / "a", "markov_collapse", "2026-01-02T00:00:00")
    (legacy / "claims.csv").write_text("claim,source,paper_value,measured,tolerance,passed\nx,y,→ 1,0.5,0.1,False\n")
    (results / "broken").mkdir()
    (results / "broken" / "run.json").write_text("{not json")
    rep = build_report(results)
    problems = "\n".join(rep.problems)
    assert len(rep.problems) == 4, problems
    assert "cov_alignment/a: claims.csv is corrupt" in problems
    assert "cov_icl_gd/a: claims.csv has 1 truncated or malformed row(s)" in problems
    assert "markov_collapse/a: claims.csv is from an older version without claim ids" in problems
    assert "broken: run.json unreadable" in problems
    assert "xu_fang.cor4_1.single_head_cos" in set(rep.claims.id)  # the good row of the truncated file stays
    proc = run_cli("report", str(results), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning:") == 4
    assert "## Problems" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "report.html").stat().st_size > 1000


def test_strict_exits_nonzero_on_a_failed_claim(results, tmp_path):
    proc = run_cli("report", str(results), "--strict")
    assert proc.returncode == 1 and "1 claim(s) failed" in proc.stdout
    assert (results / "report.md").is_file() and (results / "report.html").is_file()
    ok = tmp_path / "ok"
    make_run(ok / "a", "linreg_icl", "2026-01-01T00:00:00", [claim("dherin.fig2.patch_equals_context", 0.1, True)])
    assert run_cli("report", str(ok), "--strict").returncode == 0


def test_no_runs_and_no_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("report", str(empty))
    assert proc.returncode == 0 and "no run folders" in proc.stderr
    assert "never run" in (empty / "report.md").read_text() or "0/0" in (empty / "report.md").read_text()
    proc = run_cli("report", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "no such folder" in proc.stderr and "Traceback" not in proc.stderr


def table1_sweep(root: Path) -> Path:
    """A patch_match sweep as the Table 1 one is made: 2 models × 2 dtypes × 2 variants, 8 jobs; the open
    loop fails on tiny-gpt2 alone, the closed loop's claim is a construction."""
    sweep = root / "patch_match" / "sweep-table1"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for model in ("tiny-llama", "tiny-gpt2"):
        for dtype in ("float32", "bfloat16"):
            for variant in ("naive", "closed_loop"):
                folder = sweep / str(job)
                ok = not (model == "tiny-gpt2" and variant == "naive")
                claim_id = (f"goldwaser.fig3.naive_{dtype}_top1_match" if variant == "naive"
                            else f"goldwaser.construction.closed_loop_{dtype}_logits")
                make_run(folder, "patch_match", f"2026-01-02T00:00:{job:02d}", [claim(claim_id, 1.0, ok)])
                record = json.loads((folder / "run.json").read_text())
                record.update(model=f"{model} (random)", device="cpu", dtype=dtype, wall_time_s=10.0,
                              claims_passed=int(ok), claims_total=1,
                              overrides=["experiment=patch_match", "preset=cpu", f"model={model}", f"dtype={dtype}",
                                         f"variant={variant}"])
                (folder / "run.json").write_text(json.dumps(record))
                job += 1
    return sweep


def test_results_page_collapses_a_sweep_to_one_row_per_model(tmp_path):
    """The runs table has one row per model of the 8-job sweep (what else it swept, its jobs, their wall time
    added up, their claims), not one per job; the claims follow, the construction apart after its note."""
    root = tmp_path / "results"
    table1_sweep(root)
    page = render_results_page(build_report(root), "icl-exp report results --results-md docs/results.md")
    rows = [line for line in page.splitlines() if line.startswith("| patch_match | patch_match/sweep-table1 |")]
    assert rows == [
        "| patch_match | patch_match/sweep-table1 | tiny-llama (random) | dtype: float32, bfloat16; variant: naive, "
        "closed_loop | 4 | cpu | cpu float32, bfloat16 | 40 s | 4/4 |",
        "| patch_match | patch_match/sweep-table1 | tiny-gpt2 (random) | dtype: float32, bfloat16; variant: naive, "
        "closed_loop | 4 | cpu | cpu float32, bfloat16 | 40 s | 2/4 |"]
    assert page.index("goldwaser.fig3.naive_float32_top1_match") < page.index("Construction:") \
        < page.index("goldwaser.construction.closed_loop_float32_logits")
    assert "**FAIL** (1 of 2 jobs)" in page  # the open loop's claim, folded over the two models
    assert "## Goldwaser et al. — 2/4 claims passed" in page and "## Dherin" not in page  # papers with runs only
    # the same rows in report.md, which shares the runs table
    assert rows[0] in render_markdown(build_report(root))


def test_results_page_is_written_whole_by_the_report_command(results, tmp_path):
    page = tmp_path / "docs" / "results.md"
    proc = run_cli("report", str(results), "--results-md", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert text.startswith("# Results measured here\n")
    assert f"Generated by `icl-exp report {results} --results-md {page}` on 20" in text
    assert "at commit unknown" in text  # these hand-made runs recorded none
    assert text.index("## Dherin et al. — 1/1 claims passed") < text.index("## Xu & Fang")
    assert "`dherin.fig2.patch_equals_context`" in text and "| -1.02 … -0.7 (2 jobs) |" in text
    assert "| cov_rate | cov_rate/multirun/s1 |  |  | 2 | cpu |" in text  # a seed sweep without a model: one row
    assert "not complete: factorization" in text and "RuntimeError: boom" in text
    page.write_text("hand edits\n")
    assert run_cli("report", str(results), "--results-md", str(page)).returncode == 0
    assert "hand edits" not in page.read_text()  # the whole file is generated, every time
    # a page that cannot be a file: one line, before any report is written
    empty = tmp_path / "empty"
    make_run(empty / "a", "linreg_icl", "2026-01-01T00:00:00", [claim("dherin.fig2.patch_equals_context", 0.1, True)])
    proc = run_cli("report", str(empty), "--results-md", str(tmp_path))
    assert proc.returncode == 2 and "is a folder" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (empty / "report.md").exists()


@pytest.mark.skipif(find_browser() is None, reason="no Chromium: apt-get install chromium (as root, `nox -s tests` "
                    "installs it)")
def test_report_renders_in_headless_chromium(results, tmp_path):
    """The HTML opened in a real browser: the screenshot shows the tables' pass and FAIL cells and the
    embedded figure (its C0-blue curve), not a blank page or a broken image."""
    from matplotlib import image

    _, page = write_report(build_report(results), tmp_path / "out")
    shot = screenshot_html(page, tmp_path / "shot.png", height=1600)
    pixels = (image.imread(shot)[..., :3] * 255).round()
    assert pixels.shape[:2] == (1600, 1280)

    def present(rgb, tol=40):
        return int((abs(pixels - rgb).max(-1) <= tol).sum())

    assert present((0x17, 0x6C, 0x2F)) > 20  # the green "pass" text
    assert present((0xB0, 0x00, 0x20)) > 20  # the red "FAIL" text
    assert present((0xFD, 0xE8, 0xE8), tol=4) > 500  # the failed row's background
    assert present((31, 119, 180), tol=30) > 30  # the figure's blue curve: the base64 image decoded


def test_chromium_is_installed_only_as_root_with_apt_get(monkeypatch):
    """`nox -s tests` installs the browser for the test above only where it can (root, apt-get); elsewhere
    one line says why, and that test is skipped."""
    from tests.helpers import browser

    monkeypatch.setattr(browser, "find_browser", lambda: None)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    with pytest.raises(browser.Unavailable, match="needs root"):
        browser.ensure_installed(log=lambda _line: None)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser.shutil, "which", lambda _name: None)
    with pytest.raises(browser.Unavailable, match="no apt-get"):
        browser.ensure_installed(log=lambda _line: None)


def _sweep(root: Path, experiment: str, start: str, jobs: list[tuple[str, float, bool]], preset="smoke",
           statuses=None) -> Path:
    sweep = root / experiment / "multirun" / start.replace(":", "-")
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for i, (claim_id, measured, passed) in enumerate(jobs):
        status = (statuses or {}).get(str(i), "complete")
        make_run(sweep / str(i), experiment, start[:-1] + str(i), [claim(claim_id, measured, passed)]
                 if status == "complete" else None, status=status, preset=preset)
    return sweep


def test_a_paper_run_outranks_a_later_smoke_sweep(tmp_path):
    """The Quick start's paper run (all claims pass), then a smoke sweep: the report shows the paper run and
    says why, --strict judges the paper run, and the sweep's interrupted and running jobs are counted."""
    root = tmp_path / "results"
    make_run(root / "linreg_icl" / "paper", "linreg_icl", "2026-01-01T00:00:00",
             [claim("dherin.fig2.patch_equals_context", 1e-8, True), claim("dherin.fig2.learned", 0.05, True)],
             preset="paper")
    _sweep(root, "linreg_icl", "2026-01-02T00:00:00",
           [("dherin.fig2.learned", 0.9, False)] * 3, statuses={"1": "interrupted", "2": "running"})
    make_run(root / "linreg_icl" / "died", "linreg_icl", "2026-01-03T00:00:00", status="interrupted")
    rep = build_report(root)
    assert {str(r.path.relative_to(root)) for r in rep.runs} == {"linreg_icl/paper"}
    assert rep.n_failed_claims == 0
    why = rep.reasons["linreg_icl"]
    assert "preset=paper" in why and "highest preset" in why and "1 newer smoke run(s)" in why
    assert rep.not_complete_counts() == {"interrupted": 2, "running": 1}
    md = render_markdown(rep)
    assert "2/2 claims passed over 1 run(s) shown; 3 of the 5 run(s) found not complete (2 interrupted, " \
           "1 running)" in md
    assert "Shown: run at preset=paper" in md
    proc = run_cli("report", str(root), "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed over: 1 newer smoke run(s)" in proc.stdout


def test_smoke_failures_are_expected_and_a_sweep_claim_is_shown_once(tmp_path):
    root = tmp_path / "results"
    _sweep(root, "cov_rate", "2026-01-02T00:00:00",
           [("xu_fang.thm3_6.rate_slope", v, ok) for v, ok in ((0.5, True), (0.9, True), (2.0, False))])
    rep = build_report(root)
    assert len(rep.claims) == 3 and len(rep.shown) == 1  # one row per job read, one row shown
    row = rep.shown.iloc[0]
    assert (row["measured_min"], row["measured_max"], row["jobs"], row["jobs_passed"]) == (0.5, 2.0, 3, 2)
    assert row["expected"] and rep.n_failed_claims == 0 and rep.n_expected_failures == 1
    md = render_markdown(rep)
    assert "| 0.5 … 2 (3 jobs) |" in md and "fail (expected at smoke)" in md
    assert "0/1 claims passed (1 failed as expected at preset=smoke, not counted by --strict)" in md
    assert run_cli("report", str(root), "--strict").returncode == 0
    # the same sweep at preset=cpu: its failure counts, once, with how many jobs failed
    cpu = tmp_path / "cpu"
    _sweep(cpu, "cov_rate", "2026-01-02T00:00:00",
           [("xu_fang.thm3_6.rate_slope", v, ok) for v, ok in ((0.5, True), (2.0, False))], preset="cpu")
    rep = build_report(cpu)
    assert rep.n_failed_claims == 1 and "**FAIL** (1 of 2 jobs)" in render_markdown(rep)
    proc = run_cli("report", str(cpu), "--strict")
    assert proc.returncode == 1 and "1 claim(s) failed" in proc.stdout


def test_a_smoke_runs_failed_exactness_claim_is_never_excused(tmp_path):
    """Smoke may excuse a learning claim, never an exactness claim (`exact`, a claim that holds on any weights):
    the witness's fault battery at preset=smoke must fail `--strict`."""
    root = tmp_path / "results"
    run = make_run(root / "patch_match" / "smoke", "patch_match", "2026-01-02T00:00:00", preset="smoke",
                   claims=[claim("goldwaser.fig3.naive_float32_control_differs", 0.5, False)])
    claims = pd.read_csv(run / "claims.csv")
    exactness = claim("goldwaser.witness.naive_float32_instrumented_equals_witness", 3e-5, False, tolerance=0.0)
    pd.concat([claims.assign(exact=False), pd.DataFrame([dict(exactness, exact=True)])]).to_csv(
        run / "claims.csv", index=False)
    rep = build_report(root)
    assert rep.n_failed_claims == 1 and rep.n_expected_failures == 1  # the control claim is excused, not the other
    proc = run_cli("report", str(root), "--strict")
    assert proc.returncode == 1 and "1 claim(s) failed" in proc.stdout


def test_a_sweeps_jobs_are_in_numeric_order():
    """Job 2 of a sweep is listed before job 10 (a path sort would put 10, 11, ... first)."""
    from pathlib import Path

    from experiments.core.report.runs import path_order

    jobs = [Path(f"patch_match/sweep/{n}/run.json") for n in (10, 2, 0, 11, 1)]
    assert [p.parts[2] for p in sorted(jobs, key=path_order)] == ["0", "1", "2", "10", "11"]
    assert sorted([Path("b/1"), Path("a/2"), Path("a/10")], key=path_order) == [Path("a/2"), Path("a/10"), Path("b/1")]


def test_construction_claims_are_shown_apart_after_the_evidence(tmp_path):
    """A closed loop's claims (`.construction.` in the id) follow the paper's claims under their own note, in
    report.md and report.html alike, never in the same table."""
    root = tmp_path / "results"
    make_run(root / "patch_match" / "a", "patch_match", "2026-01-01T00:00:00",
             [claim("goldwaser.construction.closed_loop_float32_logits", 1e-7, True),
              claim("goldwaser.fig3.naive_float32_top1_match", 100.0, True, ">=", 100.0, paper_value=100.0)])
    report = build_report(root)
    md = render_markdown(report)
    evidence, built, note = (md.index("goldwaser.fig3.naive_float32_top1_match"),
                             md.index("goldwaser.construction.closed_loop_float32_logits"), md.index("Construction:"))
    assert evidence < note < built
    html = render_html(report)
    assert html.index("naive_float32_top1_match") < html.index("Construction:") < html.index("closed_loop_float32")


