"""Patched generation's two passes layer by layer: the with-context layer l, then at once the patched layer l.

Run one after the other, the with-context body reads every weight from memory, and the patched pass reads
them all again (the patch of W_gate, W_up, W_down reads each matrix and writes W + ΔW; the attention reads
its own). On the CPU that second read is most of what a patched token costs beyond a stock one: the
matrices of a Gemma 3 270M layer (~21 MB) stream from DRAM twice per token, while a layer's weights fit in
the last-level cache (32 MB here). Run back to back per layer, the patch reads them from the cache the
with-context layer just filled.

Both passes stay the model's own forward: the with-context pass runs on a helper thread and waits, after
each layer's output is recorded, until the patched pass has run that layer (`LayerRelay`); the patched
pass waits for layer l's targets before patching it. Exactly one of the two runs at any time (but for the
embedding and position set-up before layer 0), so the hooks, the parameters `functional_call` swaps in and
out, and every value are those of the sequential passes: the logits are the same bits (tested). The
with-context pass's hooks act only on its own thread, and the patched pass's interception hands the
helper thread's calls to the layer's own forward.

Measured on the 2-core CPU (Gemma 3 270M, float32, one token, machine busy with other work): 773–1620 ms
sequential against 348–437 ms interleaved. On a GPU the passes are queued kernels on one stream and
there is nothing to share: `Patcher.interleaves` is False there and the passes run one after the other.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

WAIT_S = 0.05  # waits are sliced, so Ctrl-C reaches the main thread and an abandoned helper notices


class Abandoned(Exception):
    """Raised on the helper thread when the patched pass stopped: its with-context pass stops too."""


class LayerRelay:
    """Turn-taking between the with-context pass (helper thread) and the patched pass, layer by layer."""

    def __init__(self, layers: int):
        self.ready = [threading.Event() for _ in range(layers)]  # with-context layer l recorded
        self.resume = [threading.Event() for _ in range(layers)]  # patched layer l done, or abandoned
        self.granted = [False] * layers  # patched layer l done (a resume by `abandon` leaves it False)
        self.context_thread: int | None = None
        self.error: BaseException | None = None

    def on_context_thread(self) -> bool:
        return threading.get_ident() == self.context_thread

    # -- the with-context side ----------------------------------------------------------------------
    def context_layer_done(self, index: int) -> None:
        self.ready[index].set()
        while not self.resume[index].wait(WAIT_S):
            pass
        if not self.granted[index]:
            raise Abandoned

    def context_failed(self, err: BaseException) -> None:
        self.error = err
        for event in self.ready:
            event.set()

    # -- the patched side ---------------------------------------------------------------------------
    def await_context_layer(self, index: int) -> None:
        while not self.ready[index].wait(WAIT_S):
            pass
        if self.error is not None:
            raise RuntimeError(f"the with-context pass failed at or before layer {index}: "
                               f"{type(self.error).__name__}: {self.error}") from self.error

    def patched_layer_done(self, index: int) -> None:
        self.granted[index] = True
        self.resume[index].set()

    def abandon(self) -> None:
        """The patched pass is over (or failed): let the helper thread finish, or stop at a layer the patched
        pass never reached."""
        for event in self.resume:
            event.set()


def interleaved_step(patcher, query: Tensor, cache) -> tuple[object, object]:
    """`patcher.context_step(query, cache, logits=False)` and `patcher.patched_pass(query, captures)`,
    layer by layer: (the patched pass, the with-context cache extended by the query)."""
    relay = LayerRelay(len(patcher.layers))
    captures = patcher.new_captures()
    result: dict = {}

    def context_pass() -> None:
        relay.context_thread = threading.get_ident()
        try:
            with torch.no_grad():  # grad mode is per thread
                _, _, result["cache"] = patcher.context_step({"input_ids": query}, cache, logits=False,
                                                              captures=captures, relay=relay)
        except Abandoned:
            pass
        except BaseException as err:  # handed to the patched pass, which raises it on the main thread
            relay.context_failed(err)

    helper = threading.Thread(target=context_pass, name="with-context pass", daemon=True)
    helper.start()
    try:
        patched = patcher.patched_pass(query, captures, relay=relay)
    finally:
        relay.abandon()
        helper.join()
    if relay.error is not None:
        raise relay.error
    return patched, result["cache"]
