"""A GGUF model on llama.cpp (through llama-cpp-python's ctypes bindings) behind the runner seam.

One :class:`LlamaCppRunner` holds one model and one llama.cpp context whose KV
cache is *unified* (one cell pool shared by all sequence ids), so a tree of
candidate tokens is one ``llama_decode`` batch whose tokens carry several
sequence ids (see :mod:`.plan`).  The context is the cache: ``session()``
clears it and hands out a new :class:`LlamaCppSession`; an older session then
refuses every call instead of silently reading someone else's cache.
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

try:
    # optional for the rest of sequoia, so a missing build is reported here with the fix
    import llama_cpp
except ImportError as exc:
    raise ImportError(
        "the llama.cpp runner needs llama-cpp-python: pip install llama-cpp-python==0.3.36 "
        "(it builds from source: cmake and a C++ compiler, about 5 minutes on 2 cores)") from exc
from gguf import LlamaFileType

from ..base import RunnerInfo, check_forward_args, check_keep_args
from .backend import ensure_backend
from .plan import MAX_SEQ, ForwardPlan, MemoryOp, SlotTable


@dataclass(frozen=True)
class LlamaCppOptions:
    """How a GGUF file is loaded: threads, context cells, batch sizes."""

    n_threads: int | None = None  # None: os.cpu_count()
    n_ctx: int = 4096             # KV cells: cached slots a session can hold (llama.cpp rounds up to 256)
    n_batch: int = 512            # tokens per llama_decode call; a longer forward is split in order
    n_ubatch: int = 512           # tokens per compute graph inside one llama_decode
    flash_attn: bool = False      # see LlamaCppRunner._context_params for why it is off by default
    # Re-lay quantized weights for the CPU's SIMD gemm at load (llama.cpp's "extra buffer types"; its own default).
    # None: on where llama.cpp was built with AVX-512 (2-core Zen 4: the target's one-token step 45 -> 32 ms, wider
    # batches alike), off elsewhere (2-core AVX2 EPYC: no faster for 1..64-token batches, +0.5 GB RSS for the
    # embedded pair, load 2.5 s -> 7.7 s) and where llama.cpp was built with AMX (an Intel Xeon with AMX-INT8:
    # llama_decode segfaulted on Q4_0 / Q8_0 / Q4_K_M weights with repacking on, tiny and embedded models alike).
    repack: bool | None = None

    def __post_init__(self) -> None:
        if self.n_threads is not None and self.n_threads < 1:
            raise ValueError(f"n_threads must be >= 1 or None, got {self.n_threads}")
        if self.n_ctx < 1 or self.n_batch < 1 or not 1 <= self.n_ubatch <= self.n_batch:
            raise ValueError(f"need n_ctx >= 1 and 1 <= n_ubatch <= n_batch, got n_ctx={self.n_ctx} "
                             f"n_batch={self.n_batch} n_ubatch={self.n_ubatch}")
        # llama.cpp reserves an output row per sequence id, and aborts the whole process when it cannot.
        if self.n_batch < MAX_SEQ:
            raise ValueError(f"n_batch must be at least {MAX_SEQ} (one output row per sequence id a tree may "
                             f"open), got {self.n_batch}")

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1

    @property
    def repacks(self) -> bool:
        """Whether weights are re-laid at load: ``repack``, or by default where llama.cpp runs AVX-512 kernels
        without AMX."""
        return self.repack if self.repack is not None else _repacking_pays()


@functools.cache
def _repacking_pays() -> bool:
    ensure_backend()   # the report lists the backends' CPU features: set them up first, as a load would
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    return "AVX512 = 1" in info and "AMX_INT8 = 1" not in info


class LlamaCppRunner:
    """One GGUF model and its llama.cpp context (a unified KV cache of ``max_context`` cells)."""

    device = torch.device("cpu")

    def __init__(self, path: str | Path, options: LlamaCppOptions = LlamaCppOptions(),
                 name: str | None = None) -> None:
        self.path, self.options = Path(path), options
        self._model = self._ctx = None
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = options.repacks
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {self.path} (an architecture or quantization this "
                             f"llama-cpp-python {llama_cpp.__version__} does not know?)")
        self._ctx = llama_cpp.llama_init_from_model(self._model, self._context_params(options))
        if not self._ctx:
            self.close()
            raise RuntimeError(f"llama.cpp could not create a context for {self.path} with {options} "
                               "(out of memory?)")
        # weakref.finalize frees the C objects even if close() is never called, without a __del__ cycle trap.
        self._finalizer = weakref.finalize(self, _free, self._model, self._ctx)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(vocab))
        # the GGUF's own end-of-sequence / end-of-turn ids (-1: none), for callers merging stop tokens
        self.end_tokens = tuple(dict.fromkeys(
            t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if 0 <= t < self.vocab_size))
        self.max_context = int(llama_cpp.llama_n_ctx(self._ctx))
        weights = _file_type(self._model)
        self.name = name or f"{_meta(self._model, 'general.name') or self.path.stem} ({weights})"
        self.info = RunnerInfo(runtime="llamacpp", weights=weights, device="cpu", threads=options.threads,
                               kernels=f"n_batch={options.n_batch} n_ubatch={options.n_ubatch} kv_unified"
                               + (" repack" if options.repacks else ""))
        self._batch = _Batch(options.n_batch)
        self._active: LlamaCppSession | None = None
        self.forward_calls = 0   # every session forward, for the bench's count of target calls

    @staticmethod
    def _context_params(options: LlamaCppOptions):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = options.n_ctx, options.n_batch, options.n_ubatch
        params.n_threads = params.n_threads_batch = options.threads
        params.n_seq_max = MAX_SEQ    # every sequence id a tree may open
        params.kv_unified = True      # one cell pool: sequences share cells, seq_cp is metadata only
        params.no_perf = True
        params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if options.flash_attn
                                  else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        return params

    def session(self) -> LlamaCppSession:
        """Clear the cache and return a session owning it; earlier sessions become invalid."""
        self._check_open()
        llama_cpp.llama_memory_clear(self._mem, False)  # metadata only: stale K/V bytes are never read
        self._active = LlamaCppSession(self)
        return self._active

    def close(self) -> None:
        """Free the context and the model (idempotent); the runner and its sessions are unusable after."""
        self._active = None
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        elif self._model:  # the context failed: only the model was loaded
            llama_cpp.llama_model_free(self._model)
        self._model = self._ctx = self._mem = None

    def __enter__(self) -> LlamaCppRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LlamaCppRunner({self.name!r}, threads={self.info.threads}, n_ctx={self.max_context})"

    def _check_open(self) -> None:
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: the runner was closed")


def _free(model, ctx) -> None:
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


class LlamaCppSession:
    """The runner's KV cache seen as slots (see :mod:`sequoia.runners.base`)."""

    def __init__(self, runner: LlamaCppRunner) -> None:
        self._runner = runner
        self._table = SlotTable()
        self._broken: str | None = None

    def __len__(self) -> int:
        return len(self._table)

    def forward(self, tokens: Sequence[int], parents: Sequence[int] | None = None,
                keep: int = 0) -> torch.Tensor:
        """Append ``tokens`` as slots in one batch (split every n_batch tokens).  # [keep or n, V]"""
        r = self._live()
        parents = check_forward_args(len(self), tokens, parents, keep)
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.min() < 0 or tokens.max() >= r.vocab_size:
            raise ValueError(f"forward: token ids must be in 0..{r.vocab_size - 1}, got {tokens.min()}..{tokens.max()}")
        if len(self) + len(tokens) > r.max_context:
            raise ValueError(f"forward: {len(self)} cached + {len(tokens)} new slots exceed the context of "
                             f"{r.max_context} cells; crop the session or load with a larger n_ctx")
        plan = self._table.plan(parents)
        rows = keep or len(tokens)
        out = torch.empty(rows, r.vocab_size, dtype=torch.float32)  # [rows, V]
        self._broken = "a llama_decode call failed earlier in this session"  # cleared on success
        for c in plan.copies:
            llama_cpp.llama_memory_seq_cp(r._mem, c.src, c.dst, 0, c.end)
        first_out = len(tokens) - rows  # batch index of the first row returned
        for a in range(0, len(tokens), r.options.n_batch):
            b = min(len(tokens), a + r.options.n_batch)
            r._batch.fill(tokens[a:b], plan, a, max(first_out - a, 0))
            rc = llama_cpp.llama_decode(r._ctx, r._batch.struct)
            if rc != 0:
                self._broken = f"llama_decode returned {rc} on tokens {a}..{b - 1} of a forward"
                raise RuntimeError(f"{r.name}: {self._broken} (1: no KV cells free, -1: invalid batch; "
                                   "see the error llama.cpp printed above); start a new session")
            if b > first_out:
                lo = max(a, first_out)
                out[lo - first_out:b - first_out] = _logits_rows(r, lo - a, b - lo)
        self._table.commit(parents, plan)
        self._broken = None
        r.forward_calls += 1
        return out

    def keep(self, prefix: int, slots: Sequence[int]) -> None:
        """Keep slots [0, prefix) and the path ``slots`` hanging off slot prefix-1, as one chain."""
        self._live()
        slots = check_keep_args(len(self), prefix, slots)
        self._apply(self._table.keep_ops(prefix, slots), prefix + len(slots))

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots (they must be a chain)."""
        self._live()
        self._apply(self._table.crop_ops(int(length)), int(length))

    def _apply(self, ops: list[MemoryOp], length: int) -> None:
        mem = self._runner._mem
        for op in ops:
            if op.kind == "rm":
                if not llama_cpp.llama_memory_seq_rm(mem, *op.args):
                    raise RuntimeError(f"{self._runner.name}: llama_memory_seq_rm{op.args} failed")
            elif op.kind == "cp":
                llama_cpp.llama_memory_seq_cp(mem, *op.args)
            else:
                llama_cpp.llama_memory_seq_keep(mem, *op.args)
        self._table.reset_to_chain(length)

    def _live(self) -> LlamaCppRunner:
        r = self._runner
        r._check_open()
        if r._active is not self:
            raise RuntimeError(f"{r.name}: this session is stale: runner.session() was called again and "
                               "cleared the runner's single KV cache; use the newest session")
        if self._broken:
            raise RuntimeError(f"{r.name}: this session's cache is undefined ({self._broken}); "
                               "call runner.session() for a fresh one")
        return r


class _Batch:
    """A ``llama_batch`` whose arrays are numpy buffers owned here (filled vectorised, never freed by C)."""

    def __init__(self, capacity: int) -> None:
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        self.seq = np.zeros((capacity, MAX_SEQ), np.int32)  # row i: sequence ids of token i
        i32 = ctypes.POINTER(ctypes.c_int32)
        row = self.seq.strides[0]
        self._rows = (i32 * capacity)(*(ctypes.cast(self.seq.ctypes.data + i * row, i32) for i in range(capacity)))
        self.struct = llama_cpp.llama_batch(
            n_tokens=0, token=self.token.ctypes.data_as(i32), embd=None, pos=self.pos.ctypes.data_as(i32),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32), seq_id=self._rows,
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))

    def fill(self, tokens: np.ndarray, plan: ForwardPlan, start: int, first_out: int) -> None:
        """Tokens ``start .. start + len(tokens) - 1`` of the plan; logits from chunk index ``first_out`` on."""
        m = len(tokens)
        self.token[:m] = tokens
        self.pos[:m] = plan.positions[start:start + m]
        self.logits[:m] = 0
        self.logits[first_out:m] = 1
        tags = plan.tags[start:start + m]
        if all(len(t) == 1 for t in tags):  # a chain or a level: one sequence per token
            self.n_seq_id[:m] = 1
            self.seq[:m, 0] = [t[0] for t in tags]
        else:
            for i, t in enumerate(tags):
                self.n_seq_id[i] = len(t)
                self.seq[i, :len(t)] = t
        self.struct.n_tokens = m


def _logits_rows(r: LlamaCppRunner, first: int, n: int) -> torch.Tensor:
    """Logits of batch indices first..first+n-1 of the last decode (contiguous rows).  # [n, V]"""
    v = r.vocab_size
    ptr = llama_cpp.llama_get_logits_ith(r._ctx, first)
    last = llama_cpp.llama_get_logits_ith(r._ctx, first + n - 1)
    step = ctypes.sizeof(ctypes.c_float) * v
    if not ptr or ctypes.cast(last, ctypes.c_void_p).value != ctypes.cast(ptr, ctypes.c_void_p).value + (n - 1) * step:
        raise RuntimeError(f"{r.name}: llama.cpp's output rows are not contiguous in batch order")
    return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(n, v)))


def _meta(model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def _file_type(model) -> str:
    """The GGUF weight type ("Q4_K_M", "F32", ...) from general.file_type, else llama.cpp's description."""
    raw = _meta(model, "general.file_type")
    try:
        return LlamaFileType(int(raw)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, buf, len(buf))
        return buf.value.decode("utf-8", "replace").rsplit(" ", 1)[-1] or "unknown"
