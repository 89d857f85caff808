"""The copy/compute schedule of a streamed model: k device slots, a side stream, events, never a host sync.

Every decoder layer has the same parameters, so a layer is one flat buffer
(:class:`LayerLayout` names the views into it).  Each layer's buffer lives in
host memory (pinned when the device is a GPU, so copies are asynchronous DMA);
the device holds ``in_flight`` slots of one layer each.  The copies run through
the layers in a ring, 0, 1, ..., L - 1, 0, 1, ..., each into the next slot:

* before layer j computes, the compute stream waits for the event recorded
  after its copy (``copied[slot]``);
* after layer j computes, the compute stream records ``freed[slot]`` and the
  copy of layer j + k (mod L: the next forward's first layers are copied while
  this forward finishes and the draft runs) is queued on the copy stream behind
  that event.

So at most ``in_flight`` layers are on the device at once, a copy overlaps the
compute of the k - 1 layers before it, and the host only queues work.  On a
CPU (host and device the same memory) the same calls make plain copies into
the slots and the streams and events do nothing: the schedule and the numbers
are the ones a GPU runs, only not overlapped.

``log`` (when not None) records the schedule as it is queued: ("copy", layer,
slot) and ("compute", layer, slot) then ("free", layer, slot); the tests read
it to check the bound on layers in flight.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerLayout:
    """A decoder layer's parameters as views of one flat buffer (every layer has the same)."""

    names: tuple[str, ...]              # parameter names inside a layer ("self_attn.q_proj.weight", ...)
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]            # element offset of each in the flat buffer
    numel: int                          # elements of one layer
    dtype: torch.dtype

    @classmethod
    def of(cls, layer: torch.nn.Module, dtype: torch.dtype) -> "LayerLayout":
        """The layout of ``layer``'s parameters (its buffers must be none: they would not be streamed)."""
        if any(True for _ in layer.buffers()):
            raise NotImplementedError("a decoder layer with buffers cannot be streamed")
        names, shapes, offsets, total = [], [], [], 0
        for name, p in layer.named_parameters():
            names.append(name)
            shapes.append(tuple(p.shape))
            offsets.append(total)
            total += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets), total, dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's tensor inside ``flat``.  flat: [numel]"""
        if flat.shape != (self.numel,) or flat.dtype != self.dtype:
            raise ValueError(f"a layer buffer is [{self.numel}] {self.dtype}, got {tuple(flat.shape)} {flat.dtype}")
        return [flat[o: o + int(torch.Size(s).numel())].view(s) for o, s in zip(self.offsets, self.shapes)]


def host_buffer(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """An empty flat host buffer, page-locked when ``pin`` (copies from it are asynchronous DMA).  # [numel]

    Why not ``torch.empty(pin_memory=True)``: torch's pinned allocator rounds every block up to a power of two
    (a 0.94 GB layer of Qwen2.5-32B takes 1.07 GB, +14%); registering an ordinary allocation pins exactly its
    bytes.  torch's own pinned memory stands in where registering fails.
    A failed registration leaves its error as the runtime's last error, which the next unrelated kernel launch's
    check would raise: it is read (cleared) before the fallback.  The buffer is unregistered when it is freed,
    after the device has finished the copies still queued from it (the ring always leaves its prefetches queued).
    """
    out = torch.empty(numel, dtype=dtype)
    if not pin or not numel:
        return out
    cudart = torch.cuda.cudart()
    if int(cudart.cudaHostRegister(out.data_ptr(), out.numel() * out.element_size(), 0)) == 0:
        weakref.finalize(out, _unpin, cudart, out.data_ptr())   # unlocked before the memory is freed
        return out
    clear_last_cuda_error(cudart)
    return torch.empty(numel, dtype=dtype, pin_memory=True)


def _unpin(cudart, ptr: int) -> None:
    """Unregister a host buffer once no queued copy reads it any more."""
    try:
        torch.cuda.synchronize()   # copies queued from this buffer on any stream (the ring's prefetches)
    except Exception:   # noqa: BLE001 - a failed device at teardown: unregister anyway, the process is ending
        pass
    cudart.cudaHostUnregister(ptr)


def clear_last_cuda_error(cudart=None) -> int:
    """Read (and so clear) the CUDA runtime's last error; its code (0: none).  torch binds ``cudaGetLastError``
    in some versions only; otherwise the runtime library this process loaded is asked through ctypes."""
    cudart = cudart if cudart is not None else torch.cuda.cudart()
    read = getattr(cudart, "cudaGetLastError", None)
    if read is not None:
        return int(read())
    lib = _loaded_cudart()
    return int(lib.cudaGetLastError()) if lib is not None else 0


def _loaded_cudart():
    """The CUDA runtime library mapped into this process (torch's own), or None."""
    import ctypes   # only where a registration failed: a rare path

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


class LayerStream:
    """Host buffers of every layer, ``in_flight`` device slots and the ring of copies between them."""

    def __init__(self, host: list[torch.Tensor], layout: LayerLayout, device: torch.device, in_flight: int = 2,
                 log: list[tuple[str, int, int]] | None = None) -> None:
        if not 1 <= in_flight <= len(host):
            raise ValueError(f"in_flight must be in 1..{len(host)} (the layers), got {in_flight}")
        self.host, self.layout, self.device, self.in_flight, self.log = host, layout, device, in_flight, log
        self.slots = [torch.empty(layout.numel, dtype=layout.dtype, device=device) for _ in range(in_flight)]
        self.slot_views = [layout.views(s) for s in self.slots]
        cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if cuda else None
        for slot in self.slots if cuda else ():
            slot.record_stream(self.copy_stream)   # freed slots wait for the copies still queued into them
        self.copied = [torch.cuda.Event() if cuda else None for _ in range(in_flight)]
        self.freed = [torch.cuda.Event() if cuda else None for _ in range(in_flight)]
        self.queue: deque[tuple[int, int]] = deque()    # (layer, slot) copied or copying, not yet computed
        self.next_layer = 0
        self.next_slot = 0
        self._fill()

    @property
    def layers(self) -> int:
        return len(self.host)

    def restart(self) -> None:
        """Start again at layer 0 (after a forward that stopped part-way); waits for the copies queued."""
        if self.copy_stream is not None:
            self.copy_stream.synchronize()
        self.queue.clear()
        self.next_layer = 0
        self._fill()

    def acquire(self, layer: int) -> list[torch.Tensor]:
        """Layer ``layer``'s parameters on the device (views of its slot), ordered after its copy."""
        if not self.queue or self.queue[0][0] != layer:
            raise RuntimeError(f"stream: layer {layer} computes but layer {self.queue[0][0] if self.queue else None} "
                               f"is next in the ring")
        slot = self.queue[0][1]
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied[slot])
        if self.log is not None:
            self.log.append(("compute", layer, slot))
        return self.slot_views[slot]

    def release(self, layer: int) -> None:
        """Layer ``layer`` has been queued for compute: its slot takes the next copy once that compute is done."""
        done, slot = self.queue.popleft()
        if done != layer:
            raise RuntimeError(f"stream: layer {layer} released but layer {done} was computing")
        if self.copy_stream is not None:
            self.freed[slot].record(torch.cuda.current_stream(self.device))
        if self.log is not None:
            self.log.append(("free", layer, slot))
        self._fill()

    def at_start(self) -> bool:
        """True if layer 0 is next to compute (a forward may begin)."""
        return bool(self.queue) and self.queue[0][0] == 0

    def _fill(self) -> None:
        while len(self.queue) < self.in_flight:
            self._copy(self.next_layer, self.next_slot)
            self.queue.append((self.next_layer, self.next_slot))
            self.next_layer = (self.next_layer + 1) % self.layers
            self.next_slot = (self.next_slot + 1) % self.in_flight

    def _copy(self, layer: int, slot: int) -> None:
        if self.log is not None:
            self.log.append(("copy", layer, slot))
        if self.copy_stream is None:
            self.slots[slot].copy_(self.host[layer])
            return
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(self.freed[slot])     # the slot's previous layer has computed
            self.slots[slot].copy_(self.host[layer], non_blocking=True)
            self.copied[slot].record(self.copy_stream)
