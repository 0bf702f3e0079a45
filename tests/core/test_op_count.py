"""The operation counter (experiments/core/op_count.py) counts a known computation exactly: each operation that
runs, no view, every host read (a scalar read back, a list read back) once; and nested counters both count."""

from __future__ import annotations

import torch

from experiments.core.op_count import OpCount, count_ops, per_token


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
