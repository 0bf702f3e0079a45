"""`nox -s gpu`: the check a user runs on a new GPU box, offline, in at most 8 minutes on one H100
(`python3 -m benchmarks.gpu_check [--out DIR] [--budget S] [--fake] [--dry]`). What it runs: plan.py; how a
step is run: steps.py; what comes back: summary.py (summary.md, summary.json, steps/, bench/, probe.json,
runs/, logs/ in $OUT); docs/usage.md#on-a-gpu-box."""
