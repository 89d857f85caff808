"""One typed request from the page (or the API) to the engine, parsed once.

The method registry
    :data:`METHODS` is the one list of decoding methods: each :class:`MethodInfo`
    says what a reader calls it, which page label picks it, and what the
    request's ``budget`` and ``depth`` mean for it (its ``shape``) and what
    they may ask beyond their ranges (:meth:`MethodInfo.check_bounds`).  The page
    and the command line build every proposer with
    :func:`sequoia.runtime.methods.make_method`, which reads the shape from
    here (:meth:`MethodSpec.engine_args`); nothing else decides it.

The request
    :class:`DecodeRequest` is frozen: the prompt, the method (a
    :class:`MethodSpec`), the sampling settings, the new-token limit, the seed
    and the acceptance vector, each checked against this server's
    :class:`Limits`.  :func:`parse_decode` is the one parser from the raw
    values the page's widgets or an API client send; it checks every field and
    raises :class:`RequestError` listing each bad field with a message that
    starts with the field's label (``"budget must be ..."``), so a front end
    can put each message on its own input.  :func:`parse_dp` does the same for
    a DP explorer request.

This is the one place user input is checked: the parsed request's values are
trusted below it (the DP, the optimizer and the dynamic tree assert invariants
cheaply, and refuse only what a caller inside the library could get wrong).

Pure: numbers and text only (numpy through :mod:`.dp`); no model, tokenizer,
torch or Gradio is needed to parse.  Tokenizing the prompt is the front end's
step (:meth:`DecodeRequest.tokenized` checks the count against the limits).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import (MAX_ACCEPTANCE_LEN, MAX_DEPTH, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, GenerationConfig,
                      SamplingConfig, check_dp_work)
from ..trees.dp import check_acceptance
from ..trees.tree import MAX_TREE_SIZE
from .fields import Errors, RequestError, real, whole

#: Largest seed a request may carry (torch's generators take 64-bit seeds; numpy's any size).
SEED_MAX = 2 ** 63 - 1
#: Characters per token no tokenizer reaches on average: a longer prompt is refused before tokenizing it.
CHARS_PER_TOKEN_CAP = 32
#: Highest temperature a request may ask by default: past ~2 a 150k-token vocabulary's flattened softmax
#: draws mostly noise (T=5 on the embedded pair decoded gibberish), and the draft's agreement with it is nil.
MAX_TEMPERATURE = 2.0


# ------------------------------------------------------------------ the method registry
@dataclass(frozen=True)
class MethodInfo:
    """One decoding method: its names and what a request's budget and depth mean for it.

    ``shape`` turns (budget, depth) into the factory's keywords (:meth:`MethodSpec.engine_args`):

    ``root``     the target alone: neither is used
    ``chain``    one chain of min(budget, depth) tokens
    ``chains``   budget // depth independent chains (at least one), depth tokens long
    ``kary``     a full binary tree, depth levels (budget unused)
    ``tree``     at most budget tokens, at most depth levels
    ``dynamic``  at most budget tokens, as deep as pays: up to the dynamic policy's own limit, or depth if larger
                 (the page's depth default, 8, suits the static trees; the dynamic tree capped there, budget 32,
                 took 61 target calls for five held-out code prompts where it takes 54 uncapped)
    ``file``     a tree read from a file: neither is used
    """

    name: str                 # the engine's name (make_method, --method, bench keys)
    label: str                # what a reader sees (legends, charts)
    shape: str
    budget: str = ""          # what budget means, in words (page help)
    depth: str = ""           # what depth means
    page: str = ""            # the Method dropdown's label ("": not offered on the page)
    solves_dp: bool = False   # solves the tree DP over budget x depth: a request's DP work is capped
    priced: bool = False      # prices its tree with the hardware profile
    calibrated: bool = False  # uses the draft's calibration (the dynamic tree)
    copies: bool = False      # copies n-grams from the context

    def check_bounds(self, budget: int, depth: int, acceptance: tuple[float, ...] | None) -> None:
        """What this method asks of the server beyond the per-field bounds: a DP method's solve work (the
        vector's length counts; None, the server's own default vector, is not the request's to bound)."""
        if self.solves_dp and acceptance is not None:
            check_dp_work(budget, depth, len(acceptance))

    def engine_args(self, budget: int, depth: int, dynamic_depth: int) -> dict[str, int]:
        """make_method's keywords for a request's budget and depth (``dynamic_depth``: the dynamic policy's limit)."""
        if self.shape in ("root", "file"):
            return {}
        if self.shape == "chain":
            return {"budget": min(budget, depth)}
        if self.shape == "chains":
            return {"width": max(1, budget // depth), "depth": depth}
        if self.shape == "kary":
            return {"depth": depth}
        if self.shape == "dynamic":
            return {"budget": budget, "depth": max(depth, dynamic_depth)}
        return {"budget": budget, "depth": depth}


#: Every decoding method, in the page's order.
METHODS = (
    MethodInfo("sequoia-auto", "Sequoia (auto)", "tree", "the largest tree the optimizer may pick",
               "the deepest it may pick", page="Sequoia (auto)", solves_dp=True, priced=True),
    MethodInfo("sequoia", "Sequoia", "tree", "tree size", "depth limit", page="Sequoia (budget & depth)",
               solves_dp=True),
    MethodInfo("sequoia-dynamic", "Sequoia (dynamic)", "dynamic", "at most budget tokens",
               "as deep as pays (up to the policy's limit, or depth if larger)", page="Sequoia (dynamic)",
               priced=True, calibrated=True),
    MethodInfo("sequoia-ngram", "Sequoia + n-gram", "dynamic", "at most budget tokens",
               "as deep as pays (up to the policy's limit, or depth if larger)", page="Sequoia + n-gram copies",
               priced=True, calibrated=True, copies=True),
    MethodInfo("ngram", "n-gram copies", "tree", "most copied tokens", "longest copy",
               page="n-gram copies only", priced=True, copies=True),
    MethodInfo("chain", "Chain", "chain", "chain length min(budget, depth)", "chain length min(budget, depth)",
               page="Chain"),
    MethodInfo("specinfer", "SpecInfer", "chains", "(budget ÷ depth) chains", "each chain's length",
               page="SpecInfer"),
    MethodInfo("ar", "Target alone", "root", page="Target alone"),
    MethodInfo("kary", "k-ary tree", "kary", "", "levels of a full binary tree"),
    MethodInfo("file", "tree from a file", "file"),
)
BY_NAME = {m.name: m for m in METHODS}
#: Every name make_method builds (the CLI's --method).
ENGINE_METHODS = ("ar", "chain", "specinfer", "kary", "sequoia", "sequoia-auto", "sequoia-dynamic", "file",
                  "ngram", "sequoia-ngram")
#: The methods a hardware profile prices.
PRICED_METHODS = tuple(m for m in ENGINE_METHODS if BY_NAME[m].priced)
#: Page label -> engine name (the Method dropdown, in order).
METHOD_OF_LABEL = {m.page: m.name for m in METHODS if m.page}
#: Older page labels still accepted from API clients and other tabs.
ALIASES = {"Target only": "ar"}
#: Engine name -> what a reader sees, for each method here and each Hugging Face baseline: the bench's legends,
#: the page's charts.
LABEL_OF = {
    "hf-generate": "Target alone (HF generate)",
    "ar": BY_NAME["ar"].label,
    "hf-assisted": "HF assisted",
    "hf-prompt-lookup": "HF prompt lookup",
    **{name: BY_NAME[name].label for name in ENGINE_METHODS if name != "ar"},
}


def resolve_method(value: Any) -> str:
    """The engine name of a page label, an alias or an engine name offered on the page; ValueError otherwise."""
    if isinstance(value, str):
        name = METHOD_OF_LABEL.get(value, ALIASES.get(value, value))
        if name in METHOD_OF_LABEL.values():
            return name
    raise ValueError(f"method: unknown method {value!r}; choose one of {', '.join(METHOD_OF_LABEL)}")


@dataclass(frozen=True)
class MethodSpec:
    """A method with the request's budget and depth; :meth:`engine_args` says what they mean for it."""

    name: str
    budget: int
    depth: int

    @property
    def info(self) -> MethodInfo:
        return BY_NAME[self.name]

    def engine_args(self, dynamic_depth: int) -> dict[str, int]:
        return self.info.engine_args(self.budget, self.depth, dynamic_depth)


# ------------------------------------------------------------------ limits and errors
@dataclass(frozen=True)
class Limits:
    """What one request may ask of this server (hashable: it keys the parse cache)."""

    budget_cap: int = 128                  # draft tokens per step
    max_new_tokens: int = 256              # per decode request
    max_prompt_tokens: int = 4096
    device: str = "cpu"
    max_temperature: float = MAX_TEMPERATURE

    def __post_init__(self) -> None:
        if not 0 < self.max_temperature <= 100:
            raise ValueError(f"max_temperature must be in (0, 100], got {self.max_temperature}")
        if not 1 <= self.budget_cap <= MAX_TREE_SIZE:
            raise ValueError(f"budget_cap must be in 1..{MAX_TREE_SIZE}, got {self.budget_cap}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS or not 1 <= self.max_prompt_tokens <= MAX_PROMPT_TOKENS:
            raise ValueError("token limits out of range")


def parse_vector(value: Any) -> tuple[float, ...]:
    """An acceptance vector from a list of numbers or text such as ``"0.8, 0.1"`` / ``"[0.8, 0.1]"``, checked
    (entries in [0, 1], sum at most 1, at most MAX_ACCEPTANCE_LEN entries)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("the acceptance vector is empty")
        try:
            value = json.loads(text if text.startswith("[") else f"[{text}]")
        except json.JSONDecodeError as exc:
            raise ValueError(f"acceptance vector: expected numbers separated by commas ({exc.msg})") from None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise ValueError("acceptance vector: expected a list of numbers")
    if len(value) > MAX_ACCEPTANCE_LEN:
        raise ValueError(f"acceptance vector has {len(value)} entries; the maximum is {MAX_ACCEPTANCE_LEN} "
                         "(entries past the first few change the tree very little)")
    return tuple(float(x) for x in check_acceptance(value))


# ------------------------------------------------------------------ the decode request
@dataclass(frozen=True)
class DecodeRequest:
    """Everything one decode needs, checked; build it with :func:`parse_decode`."""

    prompt: str
    method: MethodSpec
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    chat: bool = True
    acceptance: tuple[float, ...] | None = None     # None: the method's default vector
    prompt_ids: tuple[int, ...] | None = field(default=None, compare=False)   # set by :meth:`tokenized`

    @property
    def config(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, sampling=self.sampling, seed=self.seed)

    def for_method(self, method: str) -> DecodeRequest:
        """The same request with another method (a page label or name), same budget and depth."""
        return replace(self, method=MethodSpec(resolve_method(method), self.method.budget, self.method.depth))

    def tokenized(self, ids: Sequence[int], limits: Limits) -> DecodeRequest:
        """This request with its prompt's token ids, checked against ``limits``."""
        check_prompt_ids(ids, limits)
        return replace(self, prompt_ids=tuple(int(t) for t in ids))


def check_prompt_ids(ids: Sequence[int], limits: Limits) -> None:
    """RequestError naming the prompt when its token ids are more than ``limits`` takes."""
    if len(ids) > limits.max_prompt_tokens:
        raise RequestError({"prompt": f"prompt has {len(ids)} tokens; this server takes at most "
                                      f"{limits.max_prompt_tokens} per request on {limits.device}"})


def check_prompt(value: Any, limits: Limits) -> str:
    """The prompt text, refused when empty or longer than ``limits`` can take (before tokenizing it)."""
    if not isinstance(value, str):
        raise ValueError(f"prompt must be text, got {type(value).__name__}")
    if not value.strip():
        raise ValueError("prompt is empty: type something to continue")
    cap = limits.max_prompt_tokens * CHARS_PER_TOKEN_CAP
    if len(value) > cap:
        raise ValueError(f"prompt has {len(value)} characters; this server takes at most {limits.max_prompt_tokens}"
                         f" tokens per request on {limits.device}")
    return value


def _budget(value: Any, limits: Limits) -> int:
    budget = whole("budget", value, 1)
    if budget > limits.budget_cap:
        raise ValueError(f"budget {budget} is above this server's cap of {limits.budget_cap} draft tokens per step")
    return budget


def _new_tokens(value: Any, limits: Limits) -> int:
    n = whole("max new tokens", value, 1)
    if n > limits.max_new_tokens:
        raise ValueError(f"max new tokens {n} is above this server's cap of {limits.max_new_tokens} per request "
                         f"on {limits.device} (so that one request cannot hold the model for minutes)")
    return n


def check_temperature(value: Any, limits: Limits) -> float:
    """A temperature in 0..``limits.max_temperature`` (0: greedy)."""
    t = real("temperature", value)
    if not 0 <= t <= limits.max_temperature:
        raise ValueError(f"temperature must be in 0..{limits.max_temperature:g} (0 = greedy), got {t:g}")
    return t


def check_top_p(value: Any) -> float:
    """A top-p in (0, 1]."""
    p = real("top-p", value)
    if not 0 < p <= 1:
        raise ValueError(f"top-p must be in (0, 1], got {p:g}")
    return p


def check_chat(value: Any) -> bool:
    """Whether to apply the chat template, from a bool, 0/1 or their text."""
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", ""):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"chat must be true or false, got {value!r}")


def _acceptance(value: Any) -> tuple[float, ...] | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_vector(value)


def parse_decode(prompt: Any, method: Any, budget: Any, depth: Any, temperature: Any, top_p: Any,
                 max_new_tokens: Any, seed: Any, chat: Any = True, acceptance: Any = None, *,
                 limits: Limits = Limits()) -> DecodeRequest:
    """The one parser of a decode request from raw values (the page's widgets, an API call).

    ``method``: a page label, an alias or an engine name offered on the page; ``acceptance``: None or empty
    text (the default vector), a list of numbers or text such as ``"0.8, 0.1"``.  Raises
    :class:`RequestError` naming every bad field.
    """
    e = Errors()
    text = e.check("prompt", check_prompt, prompt, limits)
    name = e.check("method", resolve_method, method)
    b = e.check("budget", _budget, budget, limits)
    d = e.check("depth", whole, "depth", depth, 1, MAX_DEPTH)
    t = e.check("temperature", check_temperature, temperature, limits)
    p = e.check("top_p", check_top_p, top_p)
    n = e.check("max_new_tokens", _new_tokens, max_new_tokens, limits)
    s = e.check("seed", whole, "seed", seed, 0, SEED_MAX)
    c = e.check("chat", check_chat, chat)
    vec = e.check("acceptance", _acceptance, acceptance)
    e.raise_any()
    e.check("budget", BY_NAME[name].check_bounds, b, d, vec)
    e.raise_any()
    return DecodeRequest(prompt=text, method=MethodSpec(name, b, d), sampling=SamplingConfig(temperature=t, top_p=p),
                         max_new_tokens=n, seed=s, chat=c, acceptance=vec)


# ------------------------------------------------------------------ the DP explorer's request
@dataclass(frozen=True)
class DPRequest:
    """A DP solve: the vector, the largest budget and depth (checked against the work cap)."""

    acceptance: tuple[float, ...]
    budget: int
    depth: int


def parse_dp(acceptance: Any, budget: Any, depth: Any) -> DPRequest:
    """The one parser of a DP request; :class:`RequestError` naming every bad field."""
    e = Errors()
    vec = e.check("acceptance", parse_vector, acceptance)
    b = e.check("budget", whole, "budget", budget, 1, MAX_TREE_SIZE)
    d = e.check("depth", whole, "depth", depth, 1, MAX_DEPTH)
    e.raise_any()
    e.check("budget", check_dp_work, b, d, len(vec))
    e.raise_any()
    return DPRequest(vec, b, d)
