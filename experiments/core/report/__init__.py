"""`icl-exp report`: every claim of every paper in one place, from the run folders alone.

The work is split by job, so that a new output format touches one file and the rules for which run
speaks for an experiment live in one place:

- runs.py: find the run folders under a results folder and pick, per experiment, the run (or sweep)
  whose claims are shown, saying why; a sweep's jobs as one runs-table row per model (`run_rows`).
- collect.py: read the chosen runs' claims.csv (bad input becomes one line under "Problems", never a
  crash) into a `Report`; a sweep's jobs fold into one row per claim.
- text.py: what every rendering says about a claim or a run (numbers to 3 digits, pass / FAIL, ranges).
- markdown.py, page.py (HTML from templates/report.html.j2, figures embedded), results_page.py (the
  generated docs/results.md: runs and claims per paper, `--results-md`): the three renderings of one `Report`.
- write.py: report.md and report.html written atomically.

Papers come in registry.PAPER_PACKAGES order.
"""
