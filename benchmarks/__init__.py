"""Speed and memory targets (scripts, not tests) and the GPU box check (gpu_check/); a package so that
`python3 -m benchmarks.gpu_check` finds this folder before any other `benchmarks` on the path."""
