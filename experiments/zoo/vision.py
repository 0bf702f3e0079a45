"""Images for the image-context runs: a file the user names, or a seeded synthetic one for offline runs."""

from __future__ import annotations

from pathlib import Path

from experiments.core.errors import UserError, first_line


def synthetic_image(seed: int = 0, size: int = 64):
    """A seeded RGB test image (smooth gradients plus noise) for offline image-context runs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    rgb = np.stack([xx, yy, 0.5 * (xx + yy)], axis=-1) + 0.2 * rng.standard_normal((size, size, 3))
    return Image.fromarray((255 * np.clip(rgb, 0, 1)).astype("uint8"))


def load_image(spec: str, seed: int = 0):
    """`image=PATH` (any format PIL opens) or `image=synthetic`."""
    from PIL import Image

    if str(spec) == "synthetic":
        return synthetic_image(seed)
    path = Path(str(spec)).expanduser()
    try:
        return Image.open(path).convert("RGB")
    except Exception as err:
        raise UserError(f"cannot read image={spec!r}: {first_line(err)}") from None
