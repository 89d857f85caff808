"""A target whose decoder layers stream from host memory, behind the Hugging Face runner's session.

The model is the transformers model itself, built as a skeleton on the ``meta``
device (no memory), then filled: each decoder layer's tensors go straight into
that layer's flat host buffer (pinned on a GPU machine), everything else (the
embedding, the final norm, the head: 3.1 GB at Qwen2.5-32B's shapes against
~61 GB of layers) is loaded onto the device and stays there, as does the KV
cache.  So the model is held once: the host buffers plus the resident part,
and a load adds at most one tensor in flight (a dtype conversion's temporary).

Every forward is the model's own (:func:`~sequoia.runners.hf.lean.model_forward`,
the 4-D tree mask and positions of :class:`~sequoia.runners.hf.runner.HFSession`),
so the engine and verification see the resident runner's logits.  Each decoder
layer's parameters are views of a device slot: just before a layer runs, its
pre-forward hook waits for the layer's copy and points the parameters at the
slot holding it; just after, its forward hook frees the slot for the next copy
(:class:`~sequoia.runners.offload.stream.LayerStream`).  The hooks sit on a
model this module built and owns, and the schedule they drive is the runner's
own state (``runner.stream``).

Generic over Hugging Face decoder-only models whose layers are ``model.model.layers``
and whose only buffers are the rotary embedding's (Qwen2, Llama, Mistral).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from ..base import RunnerInfo
from ..hf.lean import model_forward
from ..hf.loading import dtype_name
from ..hf.runner import HFRunner
from .checkpoint import Checkpoint
from .stream import LayerLayout, LayerStream, host_buffer

#: How the runner describes itself (the page's runtime line reads ``info.kernels``).
STREAMED = "target streamed from host memory"
FillFn = Callable[[str, torch.Tensor], None]   # (parameter name, destination tensor) -> fills it in place


class StreamedRunner(HFRunner):
    """An :class:`HFRunner` whose decoder layers live in host memory and stream through ``stream``."""

    def __init__(self, model: PreTrainedModel, name: str, stream: LayerStream, resident_bytes: int) -> None:
        info = RunnerInfo(runtime="hf", weights=dtype_name(stream.layout.dtype), device=str(stream.device),
                          threads=torch.get_num_threads(),
                          kernels=f"{STREAMED} ({stream.in_flight} layers in flight)")
        super().__init__(model, name, info, forward_fn=self._forward)
        self.stream = stream
        self.host_bytes = stream.layout.nbytes * stream.layers     # the streamed layers, once
        self.resident_bytes = resident_bytes                        # embedding, norm, head on the device

    def _forward(self, model, ids, pos, mask, cache, keep: int = 0) -> torch.Tensor:
        if not self.stream.at_start():   # a forward stopped part-way (an exception): start the ring again
            self.stream.restart()
        return model_forward(model, ids, pos, mask, cache, keep)


def load_streamed_runner(folder: str | Path, name: str, device: torch.device, dtype: torch.dtype,
                         in_flight: int = 2, log: list | None = None) -> StreamedRunner:
    """A checkpoint folder (``config.json`` + safetensors) as a streamed runner, read layer by layer."""
    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    checkpoint = Checkpoint(folder)
    runner = streamed_runner(config, checkpoint.read_into, name, device, dtype, in_flight, log,
                             present=checkpoint.__contains__)
    if (folder / "generation_config.json").is_file():
        runner.model.generation_config = GenerationConfig.from_pretrained(folder)
        runner.end_tokens = _end_tokens(runner.model)
    return runner


def streamed_runner(config, fill: FillFn, name: str, device: torch.device, dtype: torch.dtype,
                    in_flight: int = 2, log: list | None = None,
                    present: Callable[[str], bool] = lambda name: True) -> StreamedRunner:
    """A streamed runner of ``config``'s architecture whose tensors ``fill`` writes (a checkpoint's reader, or
    random values for a measurement).  ``present(name)`` False for a tied head: it shares the embedding."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval().requires_grad_(False)
    layers, prefix = _decoder_layers(model)
    layout = LayerLayout.of(layers[0], dtype)
    pin = device.type == "cuda"
    host = [_fill_layer(layout, f"{prefix}.{i}.", fill, pin) for i in range(len(layers))]
    resident = _fill_resident(model, prefix, fill, present, device, dtype)
    _rebuild_buffers(model, device)
    stream = LayerStream(host, layout, device, in_flight, log)
    _bind_layers(layers, layout, stream)
    return StreamedRunner(model, name, stream, resident)


def host_model(runner: StreamedRunner) -> PreTrainedModel:
    """The runner's weights as an ordinary model in host memory, for a baseline that offloads its own way
    (accelerate's ``cpu_offload``): each layer's parameters are views of its host buffer (no copy), the
    resident ones copied back to the host (the embedding, norm and head: a few percent of the bytes)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(runner.model.config, dtype=runner.stream.layout.dtype,
                                                 attn_implementation="sdpa")
    model.eval().requires_grad_(False)
    layers, prefix = _decoder_layers(model)
    for i, layer in enumerate(layers):
        for name, view in zip(runner.stream.layout.names, runner.stream.layout.views(runner.stream.host[i])):
            _set_parameter(layer, name, view)
    own = dict(runner.model.named_parameters())
    for name, _ in list(model.named_parameters()):
        if not name.startswith(prefix + "."):
            _set_parameter(model, name, own[name].detach().to("cpu"))
    if runner.model.get_output_embeddings().weight is runner.model.get_input_embeddings().weight:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    _rebuild_buffers(model, torch.device("cpu"))
    return model


def _decoder_layers(model) -> tuple[torch.nn.ModuleList, str]:
    """The decoder layers (``model.model.layers``) and their parameter-name prefix."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise NotImplementedError(f"{type(model).__name__}: no decoder layers at model.model.layers to stream")
    prefix = next(name for name, m in model.named_modules() if m is layers)
    return layers, prefix


def _fill_layer(layout: LayerLayout, prefix: str, fill: FillFn, pin: bool) -> torch.Tensor:
    """One layer's flat host buffer, each parameter written in place.  # [layout.numel]"""
    flat = host_buffer(layout.numel, layout.dtype, pin)
    for name, view in zip(layout.names, layout.views(flat)):
        fill(prefix + name, view)
    return flat


def _fill_resident(model, prefix: str, fill: FillFn, present, device: torch.device, dtype: torch.dtype) -> int:
    """Load every parameter outside the decoder layers onto ``device``; bytes loaded.  A head absent from the
    checkpoint (a tied one) is the embedding."""
    tied = model.get_output_embeddings() is not None and \
        model.get_output_embeddings().weight is model.get_input_embeddings().weight
    total = 0
    for name, p in list(model.named_parameters()):
        if name.startswith(prefix + "."):
            continue
        if not present(name) and model.get_output_embeddings() is not None and \
                p is model.get_output_embeddings().weight:
            tied = True
            continue
        value = torch.empty(p.shape, dtype=dtype)
        fill(name, value)
        _set_parameter(model, name, value.to(device))
        total += value.numel() * value.element_size()
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return total


def _set_parameter(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)


def _rebuild_buffers(model, device: torch.device) -> None:
    """Buffers are computed at construction (the rotary embedding's frequencies), so a meta skeleton's are
    empty: build those modules again on the device.  Anything else with a meta buffer is refused."""
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        if not type(module).__name__.endswith("RotaryEmbedding"):
            raise NotImplementedError(f"{name}: a buffer this loader cannot rebuild ({type(module).__name__})")
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, leaf, type(module)(model.config).to(device))


def _bind_layers(layers, layout: LayerLayout, stream: LayerStream) -> None:
    """Point every layer's parameters at a device slot, and hook each layer to its turn in the ring."""
    for i, layer in enumerate(layers):
        names = [n for n, _ in layer.named_parameters()]
        if tuple(names) != layout.names:
            raise NotImplementedError(f"decoder layer {i} differs from layer 0; layers must share one structure")
        for name, view in zip(names, stream.slot_views[i % stream.in_flight]):
            _set_parameter(layer, name, view)
        params = [p for _, p in layer.named_parameters()]
        layer.register_forward_pre_hook(_acquire(stream, i, params))
        layer.register_forward_hook(_release(stream, i))


def _acquire(stream: LayerStream, index: int, params: list[torch.nn.Parameter]):
    def hook(module, args):
        for p, view in zip(params, stream.acquire(index)):
            p.data = view
    return hook


def _release(stream: LayerStream, index: int):
    def hook(module, args, output):
        stream.release(index)
    return hook


def _end_tokens(model) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    return tuple(int(t) for t in ([eos] if isinstance(eos, int) else eos or ()))
