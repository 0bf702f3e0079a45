"""Whether a reply is a reply, by the model's own likelihood: the stock model, fed the query without the system
prompt, scores the reply's tokens (mean log-probability per token, `loglik`); a reply counts only when it scores
no lower than a threshold calibrated once per system prompt on the prompted model's own replies to the FIT
queries (their CALIBRATION_QUANTILE, less SLACK nats a token). What a word list says, the model hears:
"le la les de du des un une et est pour dans avec sur" scores about −9 nats a token given "What is the capital
of Australia?" and "bonjour merci fromage baguette croissant voiture maison" −8, where the prompted model's
French replies score −0.5 to −3.6 (qwen2.5-0.5b, tests/goldwaser/test_system_compile_checks.py). Repetitions
and digit runs the model finds LIKELY once started ("Ahoy! Ahoy! …" −0.95, "1 2 … 12" −0.9): those the checks'
text side refuses (behaviours.degenerate), not the likelihood.

The held-out prompted replies test the threshold: the share it accepts is logged (`coherence_agreement`), and
so is the share of them the whole check passes (`check_agreement`); a check that fails MISCALIBRATED or more of
the prompted model's own replies says so in the run's notes and summary."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

CALIBRATION_QUANTILE = 0.1  # of the prompted replies' scores on the fit queries ...
SLACK = 1.5  # ... less this many nats a token: the threshold (word lists score 3-6 nats a token below it)
MISCALIBRATED = 0.1  # a check failing this share of the prompted model's held-out replies is miscalibrated


def loglik(logits: Tensor, reply: list[int] | tuple[int, ...]) -> float:
    """The mean log-probability per token of `reply` under teacher-forced `logits` (row i predicts reply[i])."""
    logp = torch.log_softmax(logits.double(), -1)
    return float(logp[torch.arange(len(reply)), torch.tensor(list(reply), device=logp.device)].mean())


def threshold(scores: list[float]) -> float:
    """The calibrated threshold: the CALIBRATION_QUANTILE of the prompted replies' scores less SLACK (NaN
    scores, an empty reply's, left out; -inf with none)."""
    finite = [s for s in scores if math.isfinite(s)]
    return float(np.quantile(finite, CALIBRATION_QUANTILE)) - SLACK if finite else -math.inf


@dataclass(frozen=True)
class Judge:
    """A check's verdict on a reply: its text side (behaviours.py) and the stock model's likelihood of it at or
    above the calibrated threshold. The likelihood is asked only when the text passes (a forward each)."""

    check: object  # Callable[[str], bool]
    floor: float

    def __call__(self, text: str, score) -> tuple[bool, float]:
        """(verdict, score): `score` is the reply's loglik or a callable giving it; NaN when not asked."""
        if not self.check(text):
            return False, math.nan
        value = float(score() if callable(score) else score)
        return value >= self.floor, value
