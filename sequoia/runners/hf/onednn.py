"""oneDNN's part in a bf16 CPU model's products: one-row forwards without it, many-row ones from blocked copies.

Two choices a Hugging Face runner makes at load time (:func:`sequoia.runners.hf.cpu.single_row_kernel`,
:func:`~sequoia.runners.hf.cpu.multi_row_kernel`), each measured below where it is made.

One row: torch offers no per-module or per-thread choice of its bf16 matmul kernel
(``F.linear``, ``torch.mv`` and ``torch.matmul`` all go to oneDNN while
``torch.backends.mkldnn.enabled`` is set), so a one-row forward turns that
process-wide flag off for its own duration only: :func:`single_row_scope` around
the runner's forward, :func:`single_rows_routed` around code that calls the model
itself (Hugging Face ``generate``).  Both go through :class:`_OneDnnSwitch`, the
one writer of the flag: forwards that overlap in several threads share one count,
oneDNN stays off while any one-row forward runs (a wider forward overlapping it
runs slower, never differently), and the value found before the first is
restored when the last ends.

Many rows: :class:`BlockedLinear` keeps oneDNN's blocked copy of a weight as the
module's own state (:func:`sequoia.runners.hf.kernels.block_weights` installs it).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F

from .cpu import SINGLE_ROW_ATEN

# ---------------------------------------------------------------------------- one-row bf16 forwards
# A decode step of the target alone multiplies one row by each bf16 weight.  On CPUs where oneDNN has bf16
# kernels, torch sends that row to oneDNN, whose one-row matmul costs what its two-row one does; with oneDNN
# off, torch's own kernel streams the weight at the memory's speed instead.  Measured on a 2-vCPU AVX-512-BF16
# EPYC, 2 threads, median of 21: linear(1536 -> 8960) with 1 row 1.12 ms through oneDNN, 0.63 ms through
# torch's kernel; 2 rows 0.93 / 1.24 ms, 16 rows 2.14 / 11.65 ms.  The whole 1.5B target: one token 213-229 ms
# through oneDNN, 128-147 ms without (two rows: 211-216 / 202-241 ms).  So a one-token forward of a bf16 CPU
# model runs with oneDNN off and every wider forward (prefill, verification) keeps it.


class _OneDnnSwitch:
    """oneDNN off while at least one one-row forward runs, in any thread; the earlier value back after the last.

    The flag it mirrors is the process's, so this is the process's one switch (:data:`_SWITCH`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._saved = True

    @contextmanager
    def off(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._saved = torch.backends.mkldnn.enabled
                torch.backends.mkldnn.enabled = False
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    torch.backends.mkldnn.enabled = self._saved


_SWITCH = _OneDnnSwitch()


@contextmanager
def single_row_scope(kernel: str, rows: int) -> Iterator[None]:
    """Run a forward of ``rows`` new tokens with the one-row kernel ``kernel`` chose (see above).

    ``kernel`` is a runner's own choice (:attr:`sequoia.runners.hf.runner.HFRunner.single_row_kernel`):
    "aten" turns oneDNN off while a one-row forward runs; anything else changes nothing.
    """
    if rows != 1 or kernel != SINGLE_ROW_ATEN:
        yield
        return
    with _SWITCH.off():
        yield


@contextmanager
def single_rows_routed(model: torch.nn.Module, kernel: str) -> Iterator[None]:
    """While inside, ``model``'s own one-token forwards get ``kernel`` (for code that calls the model directly,
    like Hugging Face's ``generate``); the hooks are the caller's for this span and removed on exit.

    The row count is that of ``input_ids`` (or ``inputs_embeds``); an exception inside the forward still
    restores oneDNN.
    """
    if kernel != SINGLE_ROW_ATEN:
        yield
        return
    scopes = threading.local()   # per thread: the forwards it is inside, each with its scope (or None)

    def before(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None and kwargs.get("inputs_embeds") is not None:
            ids = kwargs["inputs_embeds"][..., 0]
        stack = scopes.__dict__.setdefault("stack", [])
        scope = None
        if isinstance(ids, torch.Tensor) and ids.numel() == 1:
            scope = ExitStack()
            scope.enter_context(_SWITCH.off())
        stack.append(scope)

    def after(module, args, kwargs, output):
        stack = scopes.__dict__.get("stack")
        scope = stack.pop() if stack else None
        if scope is not None:
            scope.close()

    handles = (model.register_forward_pre_hook(before, with_kwargs=True),
               model.register_forward_hook(after, with_kwargs=True, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------------------- many-row bf16 forwards
# Verifying a tree multiplies 2-64 rows by every weight of the target, and oneDNN does that faster from a copy
# of the weight kept in its own blocked layout (torch.ops.mkldnn._reorder_linear_weight; inductor's CPU
# weight prepacking makes the same copy) than from the plain [out, in] tensor.  Measured on a 2-vCPU
# AVX-512-BF16 EPYC, 2 threads, the whole 1.5B bf16 target at a 128-token context, plain and blocked
# interleaved (six rounds, medians; two runs): 2 / 4 / 8 / 16 / 32 new tokens at 0.79-0.91 / 0.60-0.72 /
# 0.64-0.70 / 0.62-0.64 / 0.70-0.74 of the plain cost, one token 1.13-1.17x (the one-row aten kernel above
# beats oneDNN there).  Outputs are equal bit for bit (same kernel family, same sums).  So a bf16 linear
# keeps its weight for one row and multiplies two or more from the blocked copy: the copy costs one more
# set of the model's linear weights in memory (3.1 GB for the 1.5B target, its tied lm_head included).

#: Fewer rows than this are padded with zero rows: in the whole target oneDNN's products of 2-3 rows cost more
#: than those of 4 (at a 128-token context, 2 / 3 / 4 new tokens 190-202 / 178-185 / 146-157 ms).
PAD_ROWS = 4


class BlockedLinear(torch.nn.Module):
    """A bf16 ``nn.Linear`` that multiplies two or more rows (with ``one_row``, any) from oneDNN's blocked copy of
    its weight.

    ``weight`` and ``bias`` stay the original parameters (a tied lm_head stays tied, state dicts are
    unchanged); the blocked copy is held outside the module's state, as a cache of it.
    """

    def __init__(self, linear: torch.nn.Linear, one_row: bool = False) -> None:
        super().__init__()
        self.one_row = one_row   # one row too, padded (single_row_kernel "onednn-blocked": faster on AMX)
        if linear.weight.dtype != torch.bfloat16 or linear.weight.device.type != "cpu":
            raise ValueError("BlockedLinear takes a bf16 CPU linear layer")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._blocked = (torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.numel() // self.in_features
        # Always 2-D: a prefill's head input is an odd-strided [1, 1, H] view that a 3-D matmul would
        # multiply by copying the whole weight first (1.3 s on the target; see lean.head_rows).
        flat = x.reshape(rows, self.in_features)
        if rows < 1 + (not self.one_row) or x.dtype != torch.bfloat16 or not self._blocked:   # or the copy dropped
            y = F.linear(flat, self.weight, self.bias)
        else:
            if rows < PAD_ROWS:
                flat = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, self.in_features)])
            y = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), self._blocked[0], self.bias, "none", [], "")
            y = y[:rows]
        return y.reshape(*x.shape[:-1], self.out_features)

    def drop_copy(self) -> int:
        """Free the blocked copy (many rows then multiply from the plain weight, the same sums); its bytes."""
        freed = sum(t.numel() * t.element_size() for t in self._blocked)
        self._blocked = ()
        return freed

    def restore_copy(self) -> None:
        if not self._blocked:
            self._blocked = (torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None),)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16, oneDNN-blocked copy"


def blocked_copies(model: torch.nn.Module) -> list[BlockedLinear]:
    """The layers of ``model`` that :func:`block_weights` gave a blocked copy (dropped or not)."""
    return [m for m in model.modules() if isinstance(m, BlockedLinear)]


def blocked_bytes(model: torch.nn.Module) -> int:
    """Bytes the blocked copies of ``model`` hold now (0: none, or dropped)."""
    return sum(t.numel() * t.element_size() for m in blocked_copies(model) for t in m._blocked)


def drop_blocked_copies(model: torch.nn.Module) -> int:
    """Free every blocked copy of ``model``'s bf16 linears, a cache of their weights that a server short of
    memory can give back (verification then costs what it costs without :func:`block_weights`); the bytes freed."""
    freed = sum(m.drop_copy() for m in blocked_copies(model))
    gc.collect()
    return freed


def restore_blocked_copies(model: torch.nn.Module) -> None:
    """Make again the copies :func:`drop_blocked_copies` freed."""
    for m in blocked_copies(model):
        m.restore_copy()
