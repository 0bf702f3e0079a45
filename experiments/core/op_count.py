"""What a piece of PyTorch code asks of the dispatcher: its operations and its reads back to the host.

`count_ops()` is a context manager: inside it, every ATen operation that reaches the dispatcher is counted
(a `TorchDispatchMode`, so an operation is counted as it runs, after autograd and after composite operations
such as `linear` or `matmul` are taken apart into what runs: `linear` is `t` + `mm` or `addmm`), views
excluded (`OpOverload.is_view`: `view`, `t`, `select`, `detach`, slicing; they move no data and launch
nothing), and so is `aten._unsafe_view`, the view a composite `matmul` or `linear` of a batch ends with
(torch does not mark it as aliasing, for autograd's sake, but it is a view of the product: a 3-d `linear`
is `mm` and `_unsafe_view`, one operation here). Host reads are counted apart: every
`aten._local_scalar_dense` (what `.item()`, `int()`, `float()`, `bool()` of a tensor dispatch; on a GPU
each one waits for the queue) and every `Tensor.tolist()` (which reads the tensor's memory without
dispatching an operation, so a `TorchFunctionMode` sees it). A host read through `_local_scalar_dense` is
also one of the operations.

It measures code, not time: the counts do not depend on the machine. It is for the per-token budgets of
issue 54 (benchmarks/patch_bench.py `--ops`, and a step's tests: 0 host reads per token once warmed).
Nothing here imports above torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SCALAR_READ = "aten._local_scalar_dense"  # .item(), int(), float(), bool() of a tensor
UNMARKED_VIEWS = frozenset({"aten._unsafe_view"})  # views that OpOverload.is_view does not mark
LIST_READ = "Tensor.tolist"


@dataclass
class OpCount:
    """What ran inside one `count_ops()`: `ops` ATen operations (views excluded), `host_reads` values read back
    to the host; `by_op` each operation's count by name (`aten.mm`, ...; `Tensor.tolist` for a list read)."""

    ops: int = 0
    host_reads: int = 0
    by_op: Counter = field(default_factory=Counter)

    def __add__(self, other: OpCount) -> OpCount:
        return OpCount(self.ops + other.ops, self.host_reads + other.host_reads, self.by_op + other.by_op)

    def __sub__(self, other: OpCount) -> OpCount:
        by_op = Counter(self.by_op)
        by_op.subtract(other.by_op)
        return OpCount(self.ops - other.ops, self.host_reads - other.host_reads, by_op)


class _Dispatched(TorchDispatchMode):
    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if not func.is_view and name not in UNMARKED_VIEWS:
            self.count.ops += 1
            self.count.by_op[name] += 1
            if name == SCALAR_READ:
                self.count.host_reads += 1
        return func(*args, **(kwargs or {}))


class _Listed(TorchFunctionMode):
    """`Tensor.tolist` copies the tensor's values out without dispatching an operation: seen here."""

    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            self.count.host_reads += 1
            self.count.by_op[LIST_READ] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_ops() -> Iterator[OpCount]:
    """Count the operations and host reads of what runs inside (see the module's docstring); the `OpCount`
    yielded fills as it runs."""
    count = OpCount()
    with _Listed(count), _Dispatched(count):
        yield count


def per_token(counts: list[OpCount]) -> tuple[float, float]:
    """The mean operations and host reads per token over the tokens' counts."""
    if not counts:
        raise ValueError("no tokens counted")
    return sum(c.ops for c in counts) / len(counts), sum(c.host_reads for c in counts) / len(counts)


ALLOCATIONS = frozenset({"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.resolve_conj",
                         "aten.resolve_neg"})  # memory handed out, or the tensor itself back: nothing computed
FUSED = "inductor fused kernel"


def _launched(name: str) -> str | None:
    """The profiler event `name` as what `count_launches` counts it as, or None for one it does not count."""
    if "cpp_fused" in name or "triton_" in name:
        return FUSED
    if not name.startswith("aten::"):
        return None
    qualified = name.replace("::", ".")
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    view = packet is not None and any(getattr(packet, o).is_view for o in packet.overloads())
    return None if view or qualified in UNMARKED_VIEWS or qualified in ALLOCATIONS else qualified


@contextmanager
def count_launches() -> Iterator[OpCount]:
    """What a step compiled by torch.compile runs on the CPU, counted as `count_ops` counts an eager one: each of
    inductor's fused kernels (`FUSED`; seen where `torch._inductor.config.cpp.enable_kernel_profile` was on when it
    was compiled) and each ATen operation its code calls (matrix products, attention), views and allocations
    excluded, an operation another one calls not counted again. A compiled step's operations do not reach a
    `TorchDispatchMode` (under one, it runs eagerly), so they are read off the profiler's record; the counts fill in
    when the block ends. Host reads: its `_local_scalar_dense` calls (a `tolist` would break the graph)."""
    from torch.profiler import ProfilerActivity, profile

    count = OpCount()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield count
    for event in prof.events():
        count.host_reads += event.name == "aten::_local_scalar_dense"  # under `item`, or alone
        parent = event.cpu_parent
        if parent is not None and (parent.name.startswith("aten::") or "cpp_fused" in parent.name):
            continue  # called by an operation already counted
        what = _launched(event.name)
        if what is not None:
            count.ops += 1
            count.by_op[what] += 1
