"""`icl-exp` with TF32 switched on in its process before the run starts, as a notebook that called
`torch.backends.cuda.matmul.allow_tf32 = True` would: the run must then refuse its float32 exactness
claims or record them as tf32, and its run.json say so (rnn_context's claim is the one TF32 moves)."""

from __future__ import annotations

import sys

import torch


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    from cli.main import main as icl_exp

    sys.argv = ["icl-exp", *sys.argv[1:]]
    icl_exp()


if __name__ == "__main__":
    main()
