"""Weight-only quantized ``nn.Linear`` layers for CPU decoding, on torch's own packed kernels.

Why: a CPU decode step (one to a few new rows) is memory-bound, so what it
costs is the bytes of weight it streams: int8 halves them, int4 quarters them.
Activations stay in bf16: quantizing them too (dynamic int8) wrecks Qwen2's
outlier channels, and a draft that disagrees with the target is a draft that
gets rejected.

The kernels are torch's maintained weight-only ops (the ones torchao and
gpt-fast call on CPU): ``aten::_weight_int8pack_mm`` and
``aten::_weight_int4pack_mm_for_cpu``.  torchao itself is not used: its
releases pin torch versions other than the 2.13 this project runs on.

Their cost grows with rows much faster than a bf16 GEMM's (measured on an
AVX-512-BF16 CPU, 0.5B draft, 2 threads: a 700-token prefill takes ~15 s
through the int8 kernel and ~2 s dense), so past ``dense_rows`` rows a layer
multiplies with a bf16 copy of its weights instead (dequantizing on every call
measured slower than keeping the copy, and the packed int4 layout has no cheap
unpacking): a prefill or a wide verification then costs what the bf16 model
costs, a decode step what the small kernel costs, for the memory of one bf16
copy (1 GB for the 0.5B draft).  ``dense_rows=None`` keeps no copy.  Where
bf16 models get oneDNN-blocked weights (:func:`block_weights`, end of this
module) that copy is blocked too and takes over from :data:`BLOCKED_ROWS` rows.

The draft's precision changes speed and acceptance, never the output
distribution: verification is against the target alone.

Schemes: ``"none"`` (leave the model as it is), ``"int8"`` (symmetric, one
scale per output channel), ``"int4"`` (asymmetric, one scale and zero per
``group_size`` inputs; CPU only).

Fused projections: a decoder layer multiplies one hidden state by q, k and v,
and another by gate and up.  At one row each of those small matmuls pays a
call and a parallel region for little work, so :func:`quantize_weights` stacks
their rows into one quantized layer per group (q|k|v: 896 -> 1152, gate|up:
896 -> 9728 in the 0.5B draft: 97 kernel calls a forward instead of 169) and
each original name serves its slice of the one product
(:class:`FusedProjections`, :class:`ProjectionPart`).  Both schemes quantize
each output row on its own (a scale per row, or per row and input group), so
the stacked layer holds the very same numbers and its output equals the
separate layers' bit for bit (tests/runners/test_kernels.py checks it; the draft's q
is unchanged).  Measured on the AVX-512-BF16 CPU, 2 threads, while other jobs
loaded it (so ratios only): the kernels alone take 0.60x (q|k|v) and 0.92x
(gate|up) the time of the separate calls; a one-token int4 draft forward on a
100-token cache, fused against unfused interleaved, a median paired ratio of
0.64-0.99 over five runs, 0.875 in the longest (n=60; int8: 0.87).  The bytes
streamed are the same, so an idle machine gains less than a loaded one: with
one thread it was 0.98x.
"""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

from .cpu import MULTI_ROW_BLOCKED, multi_row_kernel
from .onednn import BlockedLinear

SCHEMES = ("none", "int8", "int4")
#: Rows from which a quantized layer multiplies densely (prefill, wide trees); see the module docstring.
DENSE_ROWS = 32
#: The same from a oneDNN-blocked bf16 copy (:func:`block_weights`).  The int4 0.5B draft at a 128-token context
#: on the AVX-512-BF16 CPU, int4 kernel vs blocked copy interleaved: 8 / 12 / 16 / 24 rows at 0.84-1.01 / 0.77 /
#: 0.69 / 0.59 of the int4 cost, 2 / 4 rows 1.73 / 1.16x.
BLOCKED_ROWS = 8
#: int4 group size: 32 kept the draft's top-1 agreement with the target at 0.86 (int8 0.88, g128 0.85).
INT4_GROUP = 32
_INT4_OPS = ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
#: Sibling linears that Llama-style decoder layers (Qwen2 included) apply to one input, fused where all are
#: present, by the name the fused layer takes beside them.
FUSED_GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class _WideCopy:
    """What quantized layers share: their bf16 copy for ``dense_rows`` rows or more, plain (``dense``) or, after
    :meth:`block_copy`, oneDNN-blocked in its place."""

    dense: torch.Tensor | None
    dense_rows: int
    _blocked: tuple[torch.Tensor, ...] = ()

    def _wide(self, flat: torch.Tensor) -> torch.Tensor | None:  # [rows, in] -> [rows, out], or None: few rows
        if flat.shape[0] < self.dense_rows:
            return None
        if self._blocked:
            return torch.ops.mkldnn._linear_pointwise(flat, self._blocked[0], None, "none", [], "")
        return None if self.dense is None else F.linear(flat, self.dense)

    def block_copy(self, rows: int = BLOCKED_ROWS) -> bool:
        """Replace the plain bf16 copy by a oneDNN-blocked one, used from ``rows`` rows; False without a copy."""
        if self.dense is None or self.dense.dtype != torch.bfloat16:
            return False
        self._blocked = (torch.ops.mkldnn._reorder_linear_weight(self.dense, None),)
        self.dense, self.dense_rows = None, rows
        return True


class Int8Linear(_WideCopy, torch.nn.Module):
    """Weight-only int8 linear: one scale per output channel, activations untouched."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 dense: torch.Tensor | None = None, dense_rows: int = DENSE_ROWS) -> None:
        super().__init__()
        if weight.dtype != torch.int8 or weight.ndim != 2 or scale.shape != weight.shape[:1]:
            raise ValueError("Int8Linear needs an int8 [out, in] weight and an [out] scale")
        self.out_features, self.in_features = weight.shape
        self.dense_rows = dense_rows
        self.register_buffer("weight", weight)   # [out, in] int8
        self.register_buffer("scale", scale)     # [out] in the activation dtype
        self.register_buffer("bias", bias)       # [out] or None
        self.register_buffer("dense", dense)     # [out, in] activation dtype, for many rows; or None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, dtype: torch.dtype = torch.bfloat16,
                    dense_rows: int | None = DENSE_ROWS) -> Int8Linear:
        w = linear.weight.detach()                                       # [out, in]
        scale = w.abs().amax(dim=1).float().clamp(min=1e-12) / 127      # [out] symmetric
        # In place on one fp32 copy: the 151,936-row lm_head would otherwise take three.
        q = w.to(torch.float32, copy=True).mul_((1 / scale)[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        dense = w.to(dtype, copy=True) if dense_rows is not None else None
        return cls(q, scale.to(dtype), bias, dense, dense_rows or DENSE_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features).to(self.scale.dtype)     # [rows, in]
        y = self._wide(flat)
        if y is None:
            y = torch._weight_int8pack_mm(flat.contiguous(), self.weight, self.scale)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


class Int4Linear(_WideCopy, torch.nn.Module):
    """Weight-only int4 linear: w = (q - 8) * scale + zero per group of ``group_size`` inputs, q in [0, 15]."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int, group_size: int, dense: torch.Tensor | None = None,
                 dense_rows: int = DENSE_ROWS) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, packed.shape[0]
        self.group_size = group_size
        self.dense_rows = dense_rows
        self.register_buffer("packed", packed)              # [out, in // 2] uint8, the kernel's layout
        self.register_buffer("scales_zeros", scales_zeros)  # [in // group, out, 2]
        self.register_buffer("bias", bias)                  # [out] or None
        self.register_buffer("dense", dense)                # [out, in] bf16 for many rows, or None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group_size: int = INT4_GROUP,
                    dtype: torch.dtype = torch.bfloat16, dense_rows: int | None = DENSE_ROWS) -> Int4Linear:
        require_int4()
        w = linear.weight.detach()
        out_f, in_f = w.shape
        if not int4_fits(linear, group_size):
            raise ValueError(f"an int4 layer needs in_features ({in_f}) a multiple of the int4 group size "
                             f"{group_size} and out_features ({out_f}) a multiple of 16 (the kernel's packing)")
        g = w.to(torch.float32, copy=True).reshape(out_f, -1, group_size)   # [out, groups, group]
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)         # [out, groups, 1]
        scale = (hi - lo).clamp(min=1e-6) / 15
        q = g.sub_(lo).div_(scale).round_().clamp_(0, 15).to(torch.int32).reshape(out_f, in_f)
        zero = lo + 8 * scale
        sz = torch.cat([scale, zero], -1).transpose(0, 1).contiguous().to(dtype)   # [groups, out, 2]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)         # [out, in // 2]
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        dense = w.to(dtype, copy=True) if dense_rows is not None else None
        return cls(packed, sz, bias, in_f, group_size, dense, dense_rows or DENSE_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        flat = x.reshape(-1, self.in_features).to(self.scales_zeros.dtype).contiguous()   # [rows, in]
        y = self._wide(flat)
        if y is None:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group {self.group_size}"


QuantLinear = Int8Linear | Int4Linear


class FusedProjections(torch.nn.Module):
    """One quantized matmul for sibling projections of one input; each :class:`ProjectionPart` takes its slice.

    The product is kept, keyed on the input tensor's identity (and its version
    counter where it has one: inference tensors have none), only until every part
    has taken its slice: the layer calls its parts back to back on one hidden
    state, and a part called with any other tensor recomputes, so the result is
    always the product of the tensor it was given.  The kept state is one tuple,
    read once and replaced whole, so decodes on other threads sharing the model
    can make a part recompute but never hand it another input's product.
    """

    def __init__(self, fused: QuantLinear, sizes: tuple[int, ...]) -> None:
        super().__init__()
        if sum(sizes) != fused.out_features:
            raise ValueError(f"part sizes {sizes} do not add up to the fused layer's {fused.out_features} outputs")
        self.fused = fused
        self.sizes = sizes
        # (input, its version or None, the parts [..., sizes[i]] as views of one product, parts not yet served)
        self._held: tuple[torch.Tensor, int | None, tuple[torch.Tensor, ...], int] | None = None

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., sizes[index]]
        version = None if x.is_inference() else x._version
        held = self._held
        if held is None or held[0] is not x or held[1] != version:
            held = (x, version, self.fused(x).split(self.sizes, dim=-1), len(self.sizes))
        # Every part served: drop the input and product (a prefill's is megabytes a layer).
        self._held = (*held[:3], held[3] - 1) if held[3] > 1 else None
        return held[2][index]

    def extra_repr(self) -> str:
        return f"parts={self.sizes}"


class ProjectionPart(torch.nn.Module):
    """Stands where one of the fused linears stood (same name, same call), serving its slice of the product."""

    def __init__(self, group: FusedProjections, index: int) -> None:
        super().__init__()
        # Held outside the module tree: the group is registered once, on the parent, under its own name.
        self._group = (group,)
        self.index = index
        self.in_features, self.out_features = group.fused.in_features, group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group[0].part(self.index, x)

    def extra_repr(self) -> str:
        return f"slice {self.index} of a fused projection, out_features={self.out_features}"


def stack_linears(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One ``nn.Linear`` whose output rows are those of ``linears`` in order (same input, bias or none alike)."""
    first = linears[0]
    # Built on "meta" so that its throwaway initialisation draws nothing from the global generator.
    stacked = torch.nn.Linear(first.in_features, sum(lin.out_features for lin in linears),
                              bias=first.bias is not None, device="meta")
    stacked.weight = torch.nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]),   # [sum(out), in]
                                        requires_grad=False)
    if first.bias is not None:
        stacked.bias = torch.nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False)
    return stacked


def int4_fits(linear: torch.nn.Linear, group_size: int = INT4_GROUP) -> bool:
    """Whether the int4 kernel can hold this layer (its packing works in blocks of 16 outputs)."""
    return linear.in_features % group_size == 0 and group_size % 2 == 0 and linear.out_features % 16 == 0


def int4_available() -> bool:
    return all(hasattr(torch.ops.aten, op) for op in _INT4_OPS)


def require_int4() -> None:
    if not int4_available():
        raise RuntimeError(f"int4 weights need aten::{_INT4_OPS[0]} (CPU, torch >= 2.5); torch {torch.__version__} "
                           "lacks it: use 'int8'")


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown weight quantization {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return scheme


def quantize_weights(model: torch.nn.Module, scheme: str, dtype: torch.dtype = torch.bfloat16,
                     dense_rows: int | None = DENSE_ROWS, group_size: int = INT4_GROUP,
                     fuse: bool = True) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (lm_head included) by its ``scheme`` version, in place; CPU only.

    The rest of the model runs in ``dtype``.  A layer the int4 kernel cannot hold
    (see :func:`int4_fits`) falls back to int8.  ``fuse`` stacks each
    :data:`FUSED_GROUPS` group into one quantized layer (same outputs bit for bit,
    fewer and larger matmuls; see the module docstring).
    """
    if check_scheme(scheme) == "none":
        return model
    if scheme == "int4":
        require_int4()
    model = model.to(dtype)

    def quantize(linear: torch.nn.Linear, like: torch.nn.Linear) -> QuantLinear:
        # ``like``: the layer whose fit decides the scheme (a stacked layer takes its parts' scheme).
        if scheme == "int4" and int4_fits(like, group_size):
            return Int4Linear.from_linear(linear, group_size, dtype, dense_rows)
        return Int8Linear.from_linear(linear, dtype, dense_rows)

    for parent in list(model.modules()):
        for group_name, names in FUSED_GROUPS.items() if fuse else ():
            linears = [getattr(parent, n, None) for n in names]
            if _fusable(linears, scheme, group_size):
                fused = quantize(stack_linears(linears), like=linears[0])
                group = FusedProjections(fused, tuple(lin.out_features for lin in linears))
                parent.add_module(group_name, group)
                for i, n in enumerate(names):
                    setattr(parent, n, ProjectionPart(group, i))
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, quantize(child, like=child))
    _own_parameters(model)
    gc.collect()
    return model.eval()


def _own_parameters(model: torch.nn.Module) -> None:
    """Copy the parameters quantization left (embedding, norms) out of the file they were loaded from.

    Why: from_pretrained maps the safetensors file and its tensors view that mapping; the replaced linear
    weights' pages stay resident in it for as long as any tensor views the file.  On the embedded int4 draft
    the mapping held 0.96 GB resident for a 0.27 GB embedding (measured, docs/serving.md "Memory").
    """
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()


def _fusable(linears: list, scheme: str, group_size: int) -> bool:
    """Whether these linears can share one quantized matmul and give the same numbers as their own layers."""
    if not all(isinstance(lin, torch.nn.Linear) for lin in linears):
        return False
    first = linears[0]
    same_shape = all(lin.in_features == first.in_features and (lin.bias is None) == (first.bias is None)
                     and lin.weight.dtype == first.weight.dtype for lin in linears)
    # Each part must get the scheme the stacked layer gets (int4 where it fits, else int8).
    same_kind = scheme != "int4" or len({int4_fits(lin, group_size) for lin in linears}) == 1
    return same_shape and same_kind


def describe(model: torch.nn.Module) -> str:
    """The weight scheme of ``model``'s linear layers: "int4", "int8", "none" or a mix like "int4+int8"."""
    kinds = {"int4" if isinstance(m, Int4Linear) else "int8" if isinstance(m, Int8Linear) else "none"
             for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear, torch.nn.Linear, BlockedLinear))}
    return "+".join(sorted(kinds)) or "none"


def default_draft_scheme(device_type: str, cpu_features: tuple[str, ...]) -> str:
    """The draft precision that made Sequoia fastest where it was measured (docs/benchmarks.md, kernels).

    AVX-512-BF16 CPU: int4 (a one-token draft level ~33 ms against ~69 ms in int8, agreement 0.86 vs 0.88).
    Other CPUs: int8, the configuration measured on the AVX2-only machine (int4 was not measured there).
    GPUs: the draft's own dtype.
    """
    if device_type != "cpu":
        return "none"
    return "int4" if "avx512_bf16" in cpu_features and int4_available() else "int8"


def block_weights(model: torch.nn.Module, one_row: bool = False) -> bool:
    """Give ``model``'s bf16 linears a blocked copy for many-row products where that is faster
    (measured in :mod:`sequoia.runners.hf.onednn`); ``one_row``: one-row products too
    (:data:`~sequoia.runners.hf.cpu.SINGLE_ROW_BLOCKED`).

    Only where :func:`~sequoia.runners.hf.cpu.multi_row_kernel` says so (bf16 on a CPU whose oneDNN has
    bf16 kernels).  Quantized layers swap their plain bf16 copy for a blocked one and use it from
    :data:`BLOCKED_ROWS` rows (the same memory).  True if installed; installed once.
    """
    params = next(model.parameters(), None)
    if params is None or any(isinstance(m, BlockedLinear) for m in model.modules()) or \
            multi_row_kernel(params.device.type, getattr(model, "dtype", None)) != MULTI_ROW_BLOCKED:
        return False
    for parent in list(model.modules()):
        if isinstance(parent, _WideCopy):
            parent.block_copy()
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, BlockedLinear(child, one_row))
    gc.collect()
    return True
