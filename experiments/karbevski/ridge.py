"""Least squares over a stream too large to hold: accumulate XᵀX and XᵀY chunk by chunk (in float64),
then solve (XᵀX + λI) A = XᵀY once. Used for App. 8.3's optimal linear baseline A*."""

from __future__ import annotations

import torch


class StreamingRidge:
    """The ridge solution A (d_in, d_out) of min ‖XA − Y‖² + λ‖A‖², fed rows chunk by chunk."""

    def __init__(self, d_in: int, d_out: int, lam: float, device=None):
        self.lam = lam
        self.xtx = torch.zeros(d_in, d_in, dtype=torch.float64, device=device)
        self.xty = torch.zeros(d_in, d_out, dtype=torch.float64, device=device)
        self.rows = 0

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.double(), y.double()
        self.xtx += x.T @ x
        self.xty += x.T @ y
        self.rows += x.shape[0]

    def solve(self) -> torch.Tensor:
        if self.rows == 0:
            raise ValueError("no rows seen")
        eye = torch.eye(self.xtx.shape[0], dtype=self.xtx.dtype, device=self.xtx.device)
        return torch.linalg.solve(self.xtx + self.lam * eye, self.xty)
