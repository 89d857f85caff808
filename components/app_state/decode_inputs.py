"""The raw inputs of one decode request, defined once.

:class:`DecodeInputs` lists the fields; the ``/decode`` endpoint's signature, the Live tab's widget list and
handlers, and the validators are all built from it (:data:`API_FIELDS`, :data:`PAGE_FIELDS`,
:func:`page_handler`, :func:`api_signature`), so a new field is added here and in the widget that holds it.
"""

# No ``from __future__ import annotations``: the fields' types are read back as types (gr.api's schema).

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class DecodeInputs:
    """One decode request's raw values, as the page or an API client sends them: unchecked (the page's sliders
    send floats, its acceptance is a catalogue label, and a tab may pass a parsed vector), each field checked
    once by :func:`components.app_state.validation.decode_request`.  Types and defaults are the ``/decode`` endpoint's."""

    prompt: str
    method: str = "sequoia"
    budget: int = 32
    depth: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    chat: bool = True
    acceptance: str = ""      # e.g. "0.8, 0.1, 0.05": the vector the Sequoia tree is built for ("": the default)

    @classmethod
    def from_page(cls, *values: Any) -> "DecodeInputs":
        """The inputs from the Live tab's widget values, in :data:`PAGE_FIELDS` order."""
        return cls(**dict(zip(PAGE_FIELDS, values, strict=True)))

    def values(self) -> tuple:
        """The raw values in :data:`API_FIELDS` order."""
        return tuple(getattr(self, name) for name in API_FIELDS)


#: ``/decode``'s parameters (and :func:`components.app_state.validation.decode_request`'s), in order.
API_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeInputs))
#: The Live tab's inputs in widget order (also ``/decode_stream``'s parameters): the acceptance is a label there.
PAGE_FIELDS = ("prompt", "method", "budget", "depth", "temperature", "top_p", "max_new_tokens", "seed",
               "acceptance", "chat")
assert sorted(PAGE_FIELDS) == sorted(API_FIELDS), "the page's fields are DecodeInputs' fields"
#: The Compare tab's inputs in widget order (also ``/compare_stream``'s parameters): the Live tab's but the method
#: (each row runs its own), then the methods ticked.
COMPARE_FIELDS = (*(f for f in PAGE_FIELDS if f != "method"), "methods")


def named_signature(names: Sequence[str]) -> inspect.Signature:
    """Positional parameters called ``names``: Gradio names a refused input by its handler's parameters."""
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


def with_parameters(names: Sequence[str], fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(*values)`` under a signature naming ``names``; a generator function where ``fn`` is one (Gradio
    streams only from generator functions)."""
    if inspect.isgeneratorfunction(fn):
        def handler(*values):
            yield from fn(*values)
    else:
        def handler(*values):
            return fn(*values)
    handler.__signature__ = named_signature(names)
    handler.__name__ = getattr(fn, "__name__", "handler")
    return handler


def page_handler(fn: Callable[..., T], extra: Sequence[str] = ()) -> Callable[..., T]:
    """``fn(inputs, *rest)`` as a handler of the Live tab's widgets (:data:`PAGE_FIELDS`, in order) followed by
    inputs named ``extra`` (e.g. the page's session state), passed on as ``rest``."""
    n = len(PAGE_FIELDS)
    if inspect.isgeneratorfunction(fn):
        def call(*values):
            yield from fn(DecodeInputs.from_page(*values[:n]), *values[n:])
    else:
        def call(*values):
            return fn(DecodeInputs.from_page(*values[:n]), *values[n:])
    return with_parameters((*PAGE_FIELDS, *extra), call)


def compare_handler(fn: Callable[..., T], method: str, extra: Sequence[str] = ()) -> Callable[..., T]:
    """``fn(inputs, methods, *rest)`` as a handler of the Compare tab's widgets (:data:`COMPARE_FIELDS`, in order)
    followed by inputs named ``extra`` (e.g. the tab's session state), passed on as ``rest``; the request's method
    set to ``method``."""
    n = len(COMPARE_FIELDS)

    def split(values: tuple) -> tuple:
        named = dict(zip(COMPARE_FIELDS, values[:n], strict=True))
        methods = list(named.pop("methods") or ())
        return DecodeInputs(method=method, **named), methods, *values[n:]

    if inspect.isgeneratorfunction(fn):
        def call(*values):
            yield from fn(*split(values))
    else:
        def call(*values):
            return fn(*split(values))
    return with_parameters((*COMPARE_FIELDS, *extra), call)


def api_signature(fn: Callable[..., T], returns: type) -> Callable[..., T]:
    """``fn`` (taking ``*values`` in :data:`API_FIELDS` order) with the ``/decode`` endpoint's typed signature
    and defaults, which ``gr.api`` reads for the endpoint's schema."""
    params = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=f.type,
                                default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
              for f in dataclasses.fields(DecodeInputs)]
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)
    fn.__annotations__ = {**{p.name: p.annotation for p in params}, "return": returns}
    return fn
