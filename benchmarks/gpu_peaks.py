"""A GPU's dense bf16 peak FLOP/s from its name (no sparsity), the denominator of MFU.

`torch.cuda.get_device_name` tells the H100's three forms apart: "NVIDIA H100 80GB HBM3" (SXM),
"NVIDIA H100 PCIe", "NVIDIA H100 NVL"; their peaks differ by up to 30 %. A MIG slice has a fraction of the
card's peak, and a card not listed has none here: both give None, and MFU is not reported."""

from __future__ import annotations

# (name fragment, dense bf16 FLOP/s, what it is): the first fragment found in the name wins, so a more
# specific fragment comes before a shorter one it contains. Vendors' data sheets (tensor core, dense).
PEAKS: tuple[tuple[str, float, str], ...] = (
    ("H100 PCIe", 756e12, "H100 PCIe"),
    ("H100 NVL", 835e12, "H100 NVL"),
    ("H100", 989e12, "H100 SXM"),
    ("GH200", 989e12, "GH200"),
    ("H200", 989e12, "H200"),
    ("H800", 989e12, "H800 SXM"),
    ("B200", 2250e12, "B200"),
    ("A100", 312e12, "A100"),
    ("A800", 312e12, "A800"),
    ("L40S", 362e12, "L40S"),
    ("RTX 4090", 165e12, "RTX 4090"),
    ("RTX 5090", 209e12, "RTX 5090"),
)


def peak_bf16(name: str) -> tuple[float, str] | None:
    """(dense bf16 FLOP/s, the card it was taken for) for a CUDA device name; None for a MIG slice or an
    unknown card."""
    if "MIG" in name:
        return None
    return next(((flops, card) for fragment, flops, card in PEAKS if fragment in name), None)


def describe(name: str) -> str:
    """One line for a report: the peak taken, or why there is no MFU."""
    found = peak_bf16(name)
    if found is None:
        return f"{name}: no dense bf16 peak known for this card (or a MIG slice), so no MFU"
    return f"{name}: MFU against the {found[1]}'s dense bf16 peak, {found[0] / 1e12:.0f} TFLOP/s"
