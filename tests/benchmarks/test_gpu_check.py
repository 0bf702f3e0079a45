"""`nox -s gpu`'s driver (benchmarks/gpu_check) on a machine without a GPU: it stops in one line without
CUDA; its plumbing runs end to end in the dry fake mode and leaves the summary and a JSON file for every
step; a step past its timeout is stopped, one without time left is skipped; what failed goes to the CPU;
the summary tells a CUDA problem from one of both, and MFU takes the card's own peak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import plan, summary
from benchmarks.gpu_check.cuda import no_cuda_line
from benchmarks.gpu_check.steps import Deadline, Step, run_lanes
from benchmarks.gpu_peaks import describe, peak_bf16
from experiments.core.registry import experiment_names, paper_package
from experiments.patching.families import tiny_models

ROOT = Path(__file__).resolve().parents[2]


def check(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_without_cuda_it_stops_in_one_line(tmp_path):
    """tests/conftest.py hides CUDA from every process the tests start, as a machine without a GPU has none."""
    line = no_cuda_line(sys.executable)
    assert line.startswith("no CUDA device: torch") and "\n" not in line
    out = tmp_path / "out"
    done = check("--out", str(out))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [line]
    assert not out.exists()  # nothing written


def test_dry_fake_run_lists_every_step(tmp_path):
    out = tmp_path / "out"
    done = check("--fake", "--dry", "--out", str(out), "--budget", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    experiments = {n: paper_package(n) for n in experiment_names()}
    phases = plan.build(sys.executable, tmp_path, out, experiments, True, tiny_models())
    names = [s.name for p in phases for lane in p.lanes for s in lane]
    assert {"02_pytest_gpu", "03_patch_match_tiny_families", "04_context_compile_moe", "05_gemma_match_image",
            "22_gemma_match_parallel",
            "30_gpt_wq_torchrun", "32_patch_bench_bfloat16", "33_stock_compiled_bfloat16", "34_gpt_wq_paper",
            "36_patched_compiled_bfloat16"} <= set(names)
    text = (out / "summary.md").read_text()
    data = json.loads((out / "summary.json").read_text())
    assert sorted(r["name"] for r in data["steps"]) == sorted(names)
    for name in names:
        assert f"| {name} | passed |" in text
        step = json.loads((out / "steps" / f"{name}.json").read_text())
        assert step["status"] == "passed" and (out / step["log"]).read_text().startswith("$ ")
    # every experiment runs at preset=smoke in one of the smoke steps
    smoke = " ".join(s.what for p in phases for lane in p.lanes for s in lane if s.reproduce)
    assert all(n in smoke for n in experiments)
    assert data["fake"] and "A fake check" in text


def test_a_step_past_its_timeout_is_stopped_and_one_without_time_is_skipped(tmp_path):
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    steps = [Step("slow", "sleeps", sleep, timeout_s=1), Step("bad", "exits 3", [sys.executable, "-c", "exit(3)"], 30),
             Step("missing", "no such program", [str(tmp_path / "nothing")], 30)]
    results = {r.name: r for r in run_lanes([steps[:1], steps[1:]], Deadline(60), tmp_path, {}, "test")}
    assert results["slow"].status == "timed_out" and results["slow"].rc is None
    assert (results["bad"].status, results["bad"].rc) == ("failed", 3)
    assert results["missing"].status == "failed"
    late = run_lanes([steps[1:2]], Deadline(2), tmp_path, {}, "test")[0]
    assert late.status == "skipped"
    assert json.loads((tmp_path / "steps" / "bad.json").read_text())["status"] == "skipped"  # the last word


def test_what_failed_goes_to_the_cpu(tmp_path):
    experiments = {"linreg_icl": "dherin", "rnn_context": "dherin", "multilayer_ln": "dherin", "gpt_wq": "karbevski"}
    phases = plan.build("python3", tmp_path, tmp_path / "out", experiments, fake=False)
    smoke = next(s for p in phases for lane in p.lanes for s in lane if s.name.endswith("smoke_dherin"))
    for name, status in (("linreg_icl", "complete"), ("rnn_context", "failed")):
        (Path(smoke.runs) / name).mkdir(parents=True)
        (Path(smoke.runs) / name / "run.json").write_text(json.dumps({"status": status}))
    results = {smoke.name: "failed", "32_patch_bench_bfloat16": "timed_out", "01_probe": "failed",
               "30_gpt_wq_torchrun": "passed"}
    again = {s.name: s for lane in plan.cpu_reruns(phases, results, "python3", tmp_path).lanes for s in lane}
    assert set(again) == {f"{smoke.name}.cpu", "32_patch_bench_bfloat16.cpu"}  # the probe has no CPU form
    rerun = again[f"{smoke.name}.cpu"].argv
    assert rerun[rerun.index("--only") + 1] == "multilayer_ln,rnn_context"  # not the one that completed
    bench = again["32_patch_bench_bfloat16.cpu"]
    assert bench.env == {"CUDA_VISIBLE_DEVICES": ""} and "cuda" not in " ".join(bench.argv)
    assert "cuda" in " ".join(next(s for p in phases for lane in p.lanes for s in lane
                                   if s.name == "32_patch_bench_bfloat16").argv)


def test_the_summary_tells_a_cuda_problem_from_one_of_both():
    done = [{"name": "a", "status": "failed"}, {"name": "a.cpu", "status": "passed"},
            {"name": "b", "status": "timed_out"}, {"name": "b.cpu", "status": "failed"},
            {"name": "c", "status": "failed"}, {"name": "d", "status": "passed"}]
    lines = "\n".join(summary.verdicts(done))
    assert "**a** failed: passes on the CPU: a CUDA problem" in lines
    assert "**b** timed_out: failed on the CPU as well" in lines
    assert "**c** failed: not re-run on the CPU" in lines and "**d**" not in lines


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                       ("NVIDIA H100 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                       ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),
                                       ("NVIDIA GeForce GTX 1080", None)])
def test_the_peak_comes_from_the_cards_name(name, peak):
    found = peak_bf16(name)
    assert (found and found[0]) == peak
    assert ("no MFU" in describe(name)) == (peak is None)


def test_mfu_takes_the_cards_peak(tmp_path):
    folder = tmp_path / "runs" / "gpt_wq_torchrun"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("model:\n  n_layer: 6\n  d_model: 384\n  block_size: 512\n")
    (folder / "metrics.csv").write_text("experiment,run_id,metric,value,step\ngpt_wq,r,params_total,3.0e7,\n"
                                        "gpt_wq,r,tokens_per_s,1.0e5,10\ngpt_wq,r,tokens_per_s,2.0e5,20\n")
    per_token = 6 * 3.0e7 + 12 * 6 * 384 * 512
    pcie = summary.throughput(tmp_path, "NVIDIA H100 PCIe")
    assert pcie["tokens_per_s"] == 2.0e5 and pcie["mfu"] == pytest.approx(2.0e5 * per_token / 756e12)
    assert "mfu" not in summary.throughput(tmp_path, "NVIDIA GeForce GTX 1080")
    assert "mfu" not in summary.throughput(tmp_path, None)


class _Stopped(Exception):
    pass


class _Session:
    """What the gpu session calls on nox's session: error stops, run is recorded."""

    def __init__(self):
        self.runs, self.posargs = [], []

    def error(self, message):
        raise _Stopped(message)

    def run(self, *args, **kwargs):
        self.runs.append(args)


def test_nox_gpu_session_stops_in_one_line_without_cuda(monkeypatch):
    from tests.helpers.repo import import_noxfile

    nf = import_noxfile(monkeypatch)
    monkeypatch.setattr(nf.shutil, "which", lambda name: sys.executable)  # the box's python3: this one
    session = _Session()
    with pytest.raises(_Stopped) as stopped:
        nf.gpu(session)
    assert str(stopped.value).startswith("no CUDA device: torch") and "\n" not in str(stopped.value)
    assert session.runs == []  # nothing started
    session.posargs = ["--fake", "--dry"]  # the CPU stand-in goes on
    nf.gpu(session)
    assert session.runs == [(sys.executable, "-m", "benchmarks.gpu_check", "--fake", "--dry")]


def test_the_timings_alone(tmp_path):
    """`--phases timings`: the benchmarks get the GPU's whole budget once a functional phase has passed; a
    phase that does not exist is refused in one line before anything runs."""
    out = tmp_path / "out"
    done = check("--fake", "--dry", "--phases", "timings", "--out", str(out), "--budget", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {json.loads(p.read_text())["name"] for p in (out / "steps").glob("*.json")}
    assert ran == {"32_patch_bench_bfloat16", "33_stock_compiled_bfloat16", "34_gpt_wq_paper",
                   "35_patch_bench_largest_bfloat16", "36_patched_compiled_bfloat16"}
    bad = check("--fake", "--dry", "--phases", "timing", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--phases: no phase timing" in bad.stderr and not (tmp_path / "bad").exists()


def test_a_phase_alone_fills_the_budget():
    """`--phases timings --budget 540`: the timings' steps as planned add up to at most 540 s, and alone they grow
    to fill it: the compile step gets at least 150 s, which the 2026-11-28 H200 check's compile needed."""
    from benchmarks.gpu_check.driver import longest_lane

    experiments = {"linreg_icl": "dherin"}
    timings = next(p for p in plan.build("python3", Path("/tmp"), Path("/tmp/out"), experiments, fake=False)
                   if p.name == "timings")
    assert longest_lane(timings) == sum(s.timeout_s for s in timings.lanes[0]) <= 540
    compile_step = next(s for s in timings.lanes[0] if s.name == "33_stock_compiled_bfloat16")
    assert compile_step.timeout_s * max(1.0, 540 / longest_lane(timings)) >= 150
