"""A gloo rank can abort in interpreter finalization even after its group is destroyed (SIGABRT,
"terminate called without an active exception"), and torchrun then kills the others: a run that had
done its work ends failed. `distributed.end_rank`, which the CLI calls last, leaves past finalization."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import REPO_ROOT

RANK_SCRIPT = """
import torch, torch.distributed as dist
from torch import nn
from experiments.core import distributed
distributed.init()
def train():  # as gpt_wq's loop: a DDP wrapper that is garbage, in a reference cycle, at exit
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        ddp(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
train()
out = [torch.empty(1) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.tensor([float(dist.get_rank())]))
assert [float(o) for o in out] == list(range(dist.get_world_size()))
print(f"rank {dist.get_rank()} done", flush=True)
distributed.end_rank(0)
"""

ONE_RANK_SCRIPT = """
import sys, torch.distributed as dist
from experiments.core import distributed
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
print("buffered, not yet flushed", end="")
distributed.end_rank(eval(sys.argv[1]))
print("never reached")
"""

FAILING_RANK_SCRIPT = """
import torch, torch.distributed as dist
from experiments.core import distributed
distributed.init()
try:
    if dist.get_rank() == 1:
        pending = dist.all_reduce(torch.ones(1), async_op=True)  # left waiting for a peer, as a DDP bucket
        raise RuntimeError("rank 1 fails")
    dist.barrier()
    dist.all_reduce(torch.ones(1))
except RuntimeError:
    distributed.end_rank(1)
"""


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


@pytest.mark.parametrize("launches", [1, pytest.param(6, marks=pytest.mark.slow)])
def test_gloo_ranks_exit_cleanly_after_their_collectives(tmp_path, launches):
    # With the group collected and destroyed at exit (the atexit step alone) a launch aborts only rarely, so
    # even six launches (-m slow) catch a lost end_rank only now and then. The default suite launches once;
    # what end_rank does (leave past finalization with the exit code, stdout flushed) is checked
    # deterministically below.
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    for launch in range(launches):
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                              str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"launch {launch}: {res.stderr[-2000:]}"
        assert "terminate called" not in res.stderr
        # print writes the text and its newline separately, so the four ranks' lines can interleave
        assert sorted(re.findall(r"rank \d done", res.stdout)) == [f"rank {r} done" for r in range(4)]


@pytest.mark.parametrize(("code", "status", "stderr"), [("0", 0, ""), ("None", 0, ""), ("3", 3, ""),
                                                         ("'bad config'", 1, "bad config")])
def test_end_rank_keeps_the_exit_code_and_flushes_stdout(tmp_path, code, status, stderr):
    script = tmp_path / "one.py"
    script.write_text(ONE_RANK_SCRIPT)
    res = subprocess.run([sys.executable, str(script), code], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == status, res.stderr[-2000:]
    assert res.stdout == "buffered, not yet flushed"  # flushed before os._exit, and nothing after it ran
    assert stderr in res.stderr


def test_end_rank_without_a_process_group_returns():
    from experiments.core import distributed

    assert distributed.end_rank(0) is None


def test_a_failing_rank_with_a_collective_pending_ends_the_launch(tmp_path):
    # Destroying the group would wait for the pending all_reduce (a plain gloo rank that raises hangs
    # past a 60 s limit here), so end_rank destroys only after success: the launch ends in seconds.
    script = tmp_path / "fail.py"
    script.write_text(FAILING_RANK_SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "exitcode  : 1" in res.stderr
