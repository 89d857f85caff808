"""Exact mode: a target whose one-row and many-row forwards make the same greedy choices.

Why outputs can differ at T=0 although verification is lossless: the target
alone decodes one token per forward, while verification scores many tokens in
one forward.  On a CPU a bf16 model runs those on different kernels (torch's own
one-row kernel, oneDNN's blocked many-row products, see
:mod:`sequoia.runners.hf.kernels`), whose sums round differently; bf16 logits are
coarse (steps of 0.125 near 18), so where the target's top two logits are that
close the two kernels can pick different tokens, and every later token follows
the other branch.  Both outputs are then greedy decodes of the same model, but
of two slightly different numerical versions of it.

Exact mode runs the target in float32 with the model's plain forward: no int8/int4
weights, no oneDNN-blocked copies, the plain SDPA attention of the model's own
modeling file (:func:`plain_forward`).  The one-row and the many-row forward then
differ only by float32 reassociation (measured: at most ~1e-5 of a logit on the
embedded target, :func:`kernel_gap`), so a flip needs a top-2 margin below that,
and :func:`certify` checks on every run that none came that close.  The draft
keeps its speed kernels: it only proposes, and a draft's precision changes speed
and acceptance, never which tokens the target keeps.

Cost (embedded pair): the float32 1.5B target holds 6.2 GB (bf16: 3.1 GB; plus 3.1 GB of
blocked copies where oneDNN has bf16 kernels), and a one-token step streams twice the bytes.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from ...runners.embedded import EMBEDDED, ProgressFn, default_cache_dir
from ...runners.hf.convert import ensure_converted
from ...runners.hf.loading import load_model, resolve_device, wrap_model
from ..models import EMBEDDED_NAME, load_pair

#: The dtype of an exact target.
EXACT_DTYPE = torch.float32
#: Attention implementations that are the model's own (no project kernel in between).
PLAIN_ATTENTION = ("sdpa", "eager")
#: A top-2 margin above this many times the measured kernel gap cannot flip (the gap bounds each side's error).
SAFETY = 2.0


def is_exact(pair) -> bool:
    """The pair's target already runs as exact mode runs it: a Hugging Face runner on the plain path (the
    model's own forward and kernels), float32 weights, unquantized."""
    target = pair.target
    model = getattr(target, "model", None)
    if model is None or getattr(target, "forward_fn", None) is None:
        return False                     # another runtime (llama.cpp): its own kernels, never exact here
    params = next(model.parameters(), None)
    attn = getattr(model.config, "_attn_implementation", None)
    info = target.info
    return (params is not None and params.dtype in (torch.float32, torch.float64) and attn in PLAIN_ATTENTION
            and getattr(info, "quant", "none") == "none" and not getattr(info, "single_row_kernel", "")
            and not getattr(info, "multi_row_kernel", "") and not getattr(target, "single_row_kernel", ""))


def plain_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model`` back to the model's own SDPA attention (from the few-query kernel, if it had it)."""
    if getattr(model.config, "_attn_implementation", None) not in PLAIN_ATTENTION:
        model.set_attn_implementation("sdpa")
    return model


def exact_runner(model: torch.nn.Module, name: str = ""):
    """A float32 model behind the plain runner path (its own forward, torch's own kernels)."""
    return wrap_model(plain_forward(model), name, "target", plain=True)


def load_exact_target(target: str = EMBEDDED_NAME, device: str | torch.device | None = None,
                      cache_dir=None, progress: ProgressFn | None = None, name: str = ""):
    """The target runner as exact mode runs it: float32, plain (``target``: "embedded", a hub id or a path).

    The embedded target comes from its converted bf16 directory (converted first if needed), so its
    float32 weights are the bf16 ones widened: the same numbers the bf16 pair holds.
    """
    report = progress or (lambda frac, desc: None)
    path = target
    if target == EMBEDDED_NAME:
        cache = cache_dir if cache_dir is not None else default_cache_dir()
        path = ensure_converted(EMBEDDED["target"], cache, lambda f, d: report(0.5 * f, d))
    report(0.5, "loading the float32 target")
    runner = exact_runner(load_model(path, resolve_device(device), EXACT_DTYPE), name or str(target))
    report(1.0, "float32 target ready")
    return runner


def load_exact_pair(draft: str = EMBEDDED_NAME, target: str = EMBEDDED_NAME, device: str | None = None,
                    draft_quant: str | None = None, cache_dir=None, progress: ProgressFn | None = None,
                    blocked_weights: bool = True):
    """A pair loaded for exact mode from the start (the CLI's ``--exact``): float32 plain target, the draft
    as :func:`~sequoia.runtime.models.load_pair` makes it (its speed kernels included)."""
    pair = load_pair(draft, target, device=device, dtype="fp32", draft_quant=draft_quant, target_quant="none",
                     cache_dir=cache_dir, progress=progress, blocked_weights=blocked_weights)
    return exact_pair(pair, exact_runner(pair.target.model, pair.target.name))


def exact_pair(pair, target_runner):
    """``pair`` with ``target_runner`` (float32, plain) as its target; the draft (and its kernels) is shared."""
    name = f"{pair.target_name} (fp32, exact)"
    changes = dict(target=target_runner, dtype=EXACT_DTYPE, target_name=name)
    if dataclasses.is_dataclass(pair):
        return dataclasses.replace(pair, target_quant="none", **changes)
    out = copy.copy(pair)          # a stand-in (tests): same fields, new target
    for key, value in changes.items():
        setattr(out, key, value)
    return out


def widened_target(runner, name: str = ""):
    """The float32 plain runner of a bf16 Hugging Face target already in memory, built tensor by tensor; None
    when ``runner`` holds no such model (llama.cpp, quantized weights).

    Its weights are the bf16 ones widened, the numbers :func:`load_exact_target` reads from the converted files,
    so both give the same model.  Why not read the files again: from_pretrained's float32 load of the bf16
    files peaked 3.5 GB above its result on the embedded target (a second mapping of the file and bf16
    tensors cast one module at a time), this copy only by one tensor.
    """
    model = getattr(runner, "model", None)
    if model is None or getattr(runner.info, "quant", "none") != "none":
        return None
    with torch.device("meta"):      # no allocation and no random init: every tensor is copied below
        out = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=EXACT_DTYPE,
                                               attn_implementation="sdpa")
    out = out.to_empty(device=next(model.parameters()).device)
    source = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for key, tensor in [*out.named_parameters(), *out.named_buffers()]:
            if key not in source or source[key].shape != tensor.shape:
                return None         # another architecture than the config says: read the files instead
            tensor.copy_(source[key])
    out.eval().requires_grad_(False)
    return exact_runner(out, name or getattr(runner, "name", ""))


def exact_copy(runner_or_model, name: str = ""):
    """A float32 plain runner over a copy of an unquantized model already in memory (tiny models, tests)."""
    model = getattr(runner_or_model, "model", runner_or_model)
    out = copy.deepcopy(model).float().eval().requires_grad_(False)
    return exact_runner(out, name or getattr(runner_or_model, "name", ""))


# ------------------------------------------------------------------ one-row vs many-row logits
def one_row_logits(target, prompt_ids: list[int], tokens: list[int], vocab: int) -> torch.Tensor:
    """The target alone's logits: the prompt's forward, then one forward per token.  # [len(tokens) + 1, vocab]

    ``target``: a runner.  Row j predicts ``tokens[j]`` (row 0 from the prompt's forward, as the engine's step 0).
    """
    session = target.session()
    rows = [session.forward(prompt_ids, keep=1)]
    for tok in tokens:
        rows.append(session.forward([tok], keep=1))
    return torch.cat(rows)[:, :vocab].float()


def many_row_logits(target, prompt_ids: list[int], tokens: list[int], vocab: int) -> torch.Tensor:
    """Verification's logits: the prompt's forward, then ONE forward of all ``tokens``.  # [len(tokens) + 1, vocab]

    Row j predicts ``tokens[j]`` as in :func:`one_row_logits`; the last row is that of the last token.
    """
    session = target.session()
    first = session.forward(prompt_ids, keep=1)
    rest = session.forward(tokens, keep=0) if tokens else first[:0]
    return torch.cat([first, rest])[:, :vocab].float()


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top logit minus the second, per row.  [rows, V] -> [rows]"""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


@dataclass(frozen=True)
class KernelGap:
    """How far the one-row and many-row forwards of one model are apart on one text."""

    max_abs: float                  # largest |one-row - many-row| over every logit
    same_argmax: int                # rows whose argmax agrees
    rows: int
    min_margin: float               # smallest top-2 margin of the one-row logits (the target alone's)
    bit_equal: bool                 # every logit equal bit for bit

    @property
    def certified(self) -> bool:
        """Every choice on this text is safe from the kernel difference: margins exceed the gap with room."""
        return self.same_argmax == self.rows and (self.bit_equal or self.min_margin > SAFETY * 2 * self.max_abs)


def kernel_gap(target, prompt_ids: list[int], tokens: list[int], vocab: int) -> KernelGap:
    """Compare :func:`one_row_logits` and :func:`many_row_logits` on ``prompt_ids`` + ``tokens``."""
    one = one_row_logits(target, prompt_ids, tokens, vocab)
    many = many_row_logits(target, prompt_ids, tokens, vocab)
    return KernelGap(max_abs=float((one - many).abs().max()),
                     same_argmax=int((one.argmax(-1) == many.argmax(-1)).sum()), rows=one.shape[0],
                     min_margin=float(top2_margin(one).min()), bit_equal=bool(torch.equal(one, many)))


def certify(target, prompt_ids: list[int], tokens: list[int], vocab: int) -> KernelGap:
    """The check run after an exact-mode comparison at T=0 on the target alone's output ``tokens``.

    Speculative methods agree with the target alone as long as every one of their forwards picks the
    same argmax, and their logits differ from the target alone's by the kernel gap at most; a top-2
    margin larger than twice that gap (with the :data:`SAFETY` factor) cannot flip.
    """
    return kernel_gap(target, prompt_ids, list(tokens[:-1]) if len(tokens) > 1 else list(tokens), vocab)
