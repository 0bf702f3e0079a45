"""The run folder's file names (docs/design.md, "The run folder"), apart from results.py, which writes them
with pandas: what only finds or reads a run's files (resume's job states, the report's run list) needs the
names alone. Hydra imports experiments/core/resume.py at every start-up (hydra_plugins/icl_exp_resume), the
CLI's one-line answer to a mistyped key included, so this module imports nothing."""

METRICS_FILE = "metrics.csv"
CLAIMS_FILE = "claims.csv"
RUN_FILE = "run.json"
FIGURES_DIR = "figures"
