"""The operation counter (experiments/core/op_count.py) counts a known computation exactly: each operation that
runs, no view, every host read (a scalar read back, a list read back) once; and nested counters both count."""

from __future__ import annotations

import pytest
import torch

from experiments.core.gpu_rates import compile_missing
from experiments.core.op_count import FUSED, OpCount, count_launches, count_ops, per_token


def known(x: torch.Tensor, w: torch.Tensor) -> None:
    y = torch.nn.functional.linear(x, w)  # t (a view) + mm
    y.relu_()  # in place: an operation
    row = y[0].view(-1)  # select and view: views, not counted
    int(row.sum())  # sum + one scalar read
    row.tolist()  # a list read, no operation
    bool((row > 0).any())  # gt, any + one scalar read
    y.t().contiguous()  # a view, then a copy (clone)


def test_a_known_computation_is_counted_exactly():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    with torch.no_grad(), count_ops() as count:
        known(x, w)
    assert dict(count.by_op) == {"aten.mm": 1, "aten.relu_": 1, "aten.sum": 1, "aten._local_scalar_dense": 2,
                                 "Tensor.tolist": 1, "aten.gt": 1, "aten.any": 1, "aten.clone": 1}
    assert count.ops == 8  # the two scalar reads are operations too; the list read is not
    assert count.host_reads == 3


def test_views_and_nothing_are_zero():
    x = torch.randn(4, 4)
    with count_ops() as count:
        x.view(16)[3:7].unsqueeze(0).t()
    assert count == OpCount()


def test_a_batched_linear_is_one_operation():
    """A 3-d linear is mm and the product's _unsafe_view: a view torch does not mark, counted as none."""
    x, w = torch.randn(2, 3, 4), torch.randn(5, 4)
    with torch.no_grad(), count_ops() as count:
        torch.nn.functional.linear(x, w)
        torch.matmul(x, w.t())
    assert dict(count.by_op) == {"aten.mm": 2} and count.ops == 2


def test_nested_counters_both_count_and_subtract():
    x = torch.randn(8)
    with count_ops() as outer:
        x.exp()
        with count_ops() as inner:
            x.sin().sum().item()
    assert (inner.ops, inner.host_reads) == (3, 1)
    assert (outer.ops, outer.host_reads) == (4, 1)
    rest = outer - inner
    assert (rest.ops, rest.host_reads, +rest.by_op) == (1, 0, {"aten.exp": 1})
    assert per_token([outer, inner]) == (3.5, 1.0)


def fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ((x @ w).relu() * 2 + 1).view(-1)


def test_launches_of_eager_code_are_its_operations_as_called():
    """Read off the profiler: each operation called once (matmul, not its mm beside it), views and allocations
    none, a scalar read counted as a host read."""
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    with torch.no_grad(), count_launches() as count:
        fused(x, w).sum().item()
        torch.empty(3).t()
    assert dict(count.by_op) == {"aten.matmul": 1, "aten.relu": 1, "aten.mul": 1, "aten.add": 1, "aten.sum": 1,
                                 "aten.item": 1}
    assert count.host_reads == 1


def test_a_compiled_functions_launches_are_its_fused_kernels_and_what_it_calls():
    """Inductor (CPU, a C++ compiler needed) fuses relu, mul and add into one kernel beside the matrix product, which
    it calls as an ATen operation: fewer launches than the four eager operations."""
    if compile_missing("cpu"):
        pytest.skip(f"torch.compile on the CPU needs {compile_missing('cpu')}")
    import torch._inductor.config as inductor

    x, w = torch.randn(3, 4), torch.randn(4, 5)
    torch._dynamo.reset()
    with inductor.patch({"cpp.enable_kernel_profile": True}):
        compiled = torch.compile(fused, dynamic=False)
        expected = compiled(x, w)
    with count_launches() as count:
        out = compiled(x, w)
    torch._dynamo.reset()
    assert torch.allclose(out, fused(x, w)) and torch.equal(out, expected)
    assert count.by_op["aten.mm"] + count.by_op["aten.addmm"] == 1 and count.by_op[FUSED] >= 1
    assert count.ops < 4 and count.host_reads == 0
