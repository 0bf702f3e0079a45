"""Hooks placed once: what the patching reads off a forward (and the few things it changes in it) attached to a
module's one pair of hooks, not registered anew every pass (issue 54, a step that compiles once).

Every token the patching reads each layer's values by forward hooks (capture.py), runs kept actions by them, and
removes them again. Registering a torch hook makes a `RemovableHandle`, which moves a class-wide counter: under
`torch.compile` that is a graph break at every registration and a guard that fails at the next token, so the
step is compiled again every token. Here a module gets one `Tap` (one forward pre-hook and one forward hook,
placed the first time something is attached to it) that runs, in the order attached, whatever is attached to it
now; attaching and detaching is a list append and removal, which the compiler traces. The torch hooks come off
again when the last attachment does, so outside a `session` a model is left as it was found (no hook; the
witness's audit sees none); inside one (`patched_generate`) they stay placed until it ends, so after the first
token a pass places nothing: `RemovableHandle.next_id` stays where it is (a test).

The closed loop's solve in place of a layer's forward is placed the same way (`replace_forward`).

A hook attached here has torch's signature and meaning: a pre-hook returning something replaces the module's
input (args, or (args, kwargs) with `with_kwargs`), a forward hook returning something replaces its output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

_ATTR = "_patching_tap"
_sessions: list[tuple[set[int], list[Tap]]] = []  # each open `session`: its model's modules, the taps it keeps


class Tap:
    """One module's placed pair of hooks (and forward, where one is replaced), and what is attached to each."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.pre: list[Attached] = []
        self.post: list[Attached] = []
        self.forward: list[Attached] = []  # the newest one runs in place of the module's own forward
        self.pinned = False
        self.handles = (module.register_forward_pre_hook(self._run_pre, with_kwargs=True),
                        module.register_forward_hook(self._run_post, with_kwargs=True))

    def _run_pre(self, module, args, kwargs):
        changed = False
        for attached in self.pre:
            hook = attached.hook
            result = hook(module, args, kwargs) if attached.with_kwargs else hook(module, args)
            if result is not None:
                changed = True
                if attached.with_kwargs:
                    args, kwargs = result
                else:
                    args = result if isinstance(result, tuple) else (result,)
        return (args, kwargs) if changed else None  # None: torch's fast path, the input as it was

    def _run_post(self, module, args, kwargs, output):
        changed = False
        for attached in self.post:
            hook = attached.hook
            result = hook(module, args, kwargs, output) if attached.with_kwargs else hook(module, args, output)
            if result is not None:
                changed, output = True, result
        return output if changed else None

    def _run_forward(self, *args, **kwargs):
        if self.forward:
            return self.forward[-1].hook(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def idle(self) -> bool:
        return not self.pre and not self.post and not self.forward

    def lift(self) -> None:
        """The torch hooks (and a placed forward) off the module again (nothing attached, no session keeping
        it)."""
        for handle in self.handles:
            handle.remove()
        if self.module.__dict__.get("forward") == self._run_forward:
            del self.module.forward
        if self.module.__dict__.get(_ATTR) is self:
            del self.module.__dict__[_ATTR]


class Attached:
    """A hook attached to a tap, as `attach_pre` / `attach_post` give it: `remove()` detaches it (as a torch
    handle's would)."""

    def __init__(self, tap: Tap, where: list, hook: Callable, with_kwargs: bool):
        self.tap, self.where, self.hook, self.with_kwargs = tap, where, hook, with_kwargs

    def remove(self) -> None:
        for i, attached in enumerate(self.where):
            if attached is self:
                del self.where[i]
                break
        if self.tap.idle() and not self.tap.pinned:
            self.tap.lift()


def _tap(module: nn.Module) -> Tap:
    tap = module.__dict__.get(_ATTR)
    if tap is None:
        tap = Tap(module)
        module.__dict__[_ATTR] = tap  # beside the module's own state, not a submodule or a buffer
        keeper = _keeper(module)
        if keeper is not None:
            tap.pinned = True
            keeper.append(tap)
    return tap


def _keeper(module: nn.Module) -> list[Tap] | None:
    """The taps of the innermost open session on `module`'s model, or None."""
    return next((placed for modules, placed in reversed(_sessions) if id(module) in modules), None)


def attach_pre(module: nn.Module, hook: Callable, with_kwargs: bool = False) -> Attached:
    """`hook` runs before `module`'s forward, as `module.register_forward_pre_hook(hook, with_kwargs=...)` would."""
    tap = _tap(module)
    tap.pre.append(attached := Attached(tap, tap.pre, hook, with_kwargs))
    return attached


def attach_post(module: nn.Module, hook: Callable, with_kwargs: bool = False) -> Attached:
    """`hook` runs after `module`'s forward, as `module.register_forward_hook(hook, with_kwargs=...)` would."""
    tap = _tap(module)
    tap.post.append(attached := Attached(tap, tap.post, hook, with_kwargs))
    return attached


def replace_forward(module: nn.Module, forward: Callable) -> Attached:
    """`forward(*args, **kwargs)` runs in place of `module`'s own forward (placed on the instance once, as
    the hooks are: a forward assigned and deleted every pass is one more thing torch.compile cannot trace)."""
    tap = _tap(module)
    if module.__dict__.get("forward") != tap._run_forward:
        module.forward = tap._run_forward
    tap.forward.append(attached := Attached(tap, tap.forward, forward, False))
    return attached


@contextmanager
def session(model: nn.Module) -> Iterator[None]:
    """Inside the block, a tap placed on one of `model`'s modules stays placed when nothing is attached to it, so
    the next pass places nothing; at its end every tap it placed with nothing attached comes off (or stays with an
    enclosing session on the same model). Another model's taps are not its business: a generation left open
    does not keep hooks on a model it never ran."""
    modules = {id(m) for m in model.modules()}
    placed: list[Tap] = []
    _sessions.append((modules, placed))
    try:
        yield
    finally:
        del _sessions[next(i for i, (_, open_) in enumerate(_sessions) if open_ is placed)]  # generators interleave
        for tap in placed:
            keeper = _keeper(tap.module)
            if keeper is not None:
                keeper.append(tap)
                continue
            tap.pinned = False
            if tap.idle():
                tap.lift()
