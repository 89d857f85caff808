"""Summaries of a bench run (medians per prompt set) and their JSON / Markdown forms.

Every number here is computed from :class:`sequoia.runtime.measuring.timing.RunResult` alone.
``speedup`` is the median over prompts of each prompt's tokens/s ratio to
``hf-generate`` on the same prompt and temperature (the target alone),
``vs_assisted`` the same ratio to ``hf-assisted``, and ``vs_best_hf`` the ratio
to the faster of ``hf-assisted`` and ``hf-prompt-lookup`` on that prompt (the
better of Hugging Face's two kinds of drafting, prompt by prompt: the bar the
combined ``sequoia-ngram`` is held to).  Per-prompt ratios cancel how long or
easy each prompt is, which medians of tokens/s alone do not.

tokens/s is end to end: the prompt's forward included, which every method pays
alike (7-10 s for a 700-token prompt on a 2-core CPU), so on long prompts it
caps every ratio.  ``first_token_s`` (time to the first output) and the decode
rate after it (``decode_tokens_per_s``, with ``decode_speedup`` and
``decode_vs_best_hf`` the same per-prompt ratios of it) show the two parts
apart, as serving benchmarks report time to first token and time per token.

Every ratio is a median of per-prompt ratios (Spec-Bench's per-prompt speedups) through the statistics the
Compare tab uses (:mod:`sequoia.core.statistics.rounds`: paired ratios, their median and range); ``speedup_lo`` and
``speedup_hi`` are the range over the prompts, shown beside the median, so a ratio whose range holds 1
reads as what it is.  A bench of R > 1 rounds pairs each run with the reference's run of the same prompt
*and round*; a prompt's ratio is the median of its rounds' ratios, a prompt's rate the median of its
rounds' rates, and ``round_spread`` (the median over prompts of half the rounds' range, relative) says how
much a row's ratio to its own runtime's target alone moved from round to round: the machine's noise, apart
from how prompts differ.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .._meta import read_json
from ..core.requests.request import LABEL_OF
from ..core.statistics import rounds
from ..runtime.measuring.timing import RunResult
from .bench import BENCH_METHODS, BenchResult

FORMAT = "sequoia-bench/1"

#: The Hugging Face drafting baselines whose better one, per prompt, ``vs_best_hf`` compares with.
BEST_HF = ("hf-assisted", "hf-prompt-lookup")


@dataclass(frozen=True)
class MethodSummary:
    method: str
    prompt_set: str
    temperature: float
    runs: int
    tokens_per_s: float               # median over prompts
    wall_tokens_per_s: float          # the same from wall time (differs when the bench ran on the process clock)
    speedup: float                    # median per-prompt ratio to hf-generate (nan without it)
    vs_assisted: float                # median per-prompt ratio to hf-assisted (nan without it)
    vs_best_hf: float                 # median per-prompt ratio to the faster of BEST_HF (nan without both)
    tokens_per_call: float            # median new tokens per target forward
    new_tokens: int                   # summed over prompts
    draft_frac: float | None          # of the summed step time (engine methods)
    verify_frac: float | None
    other_frac: float | None
    outside_frac: float | None        # of wall time spent outside steps (the generator's own overhead)
    mismatches: int | None            # T=0: prompts whose output differs from target-only greedy
    compared: int | None              # T=0: prompts compared
    first_token_s: float = math.nan   # median time to the first output (nan where no run timed it)
    decode_tokens_per_s: float = math.nan  # median decode rate after the first output
    decode_speedup: float = math.nan  # median per-prompt ratio of decode rates to hf-generate
    decode_vs_best_hf: float = math.nan    # the same to the faster decode of BEST_HF
    vs_runtime_alone: float = math.nan     # median per-prompt ratio to its own runtime's target alone
                                           # (hf-generate for Hugging Face rows, RUNTIME:ar for RUNTIME:* rows)
    speedup_lo: float = math.nan      # the smallest and largest per-prompt ratio to hf-generate
    speedup_hi: float = math.nan
    prompts: int = 0                  # prompts run (runs = prompts x rounds)
    rounds: int = 1                   # timed rounds per prompt
    round_spread: float = math.nan    # median over prompts of the half range of the rounds' ratios to its own
                                      # runtime's target alone, relative (0.05: +-5%); nan with one round


def runtime_of(method: str) -> str:
    """The runtime prefix of a bench row's method ("llamacpp" in "llamacpp:sequoia"; "" for Hugging Face rows)."""
    return method.split(":", 1)[0] if ":" in method else ""


def _report_order(method: str) -> tuple:
    runtime = runtime_of(method)
    base = method.split(":", 1)[1] if runtime else method
    return (runtime != "", runtime, BENCH_METHODS.index(base) if base in BENCH_METHODS else len(BENCH_METHODS))


def load_line(loads: list[float], cores: int) -> str:
    """What the OS load averages after the runs say: the bench's own threads count in them, so only a load
    above the core count means other processes were competing."""
    loads = sorted(loads)
    busy = ("above the core count: other processes were competing" if loads[-1] > cores + 0.5 else
            f"within the {cores} cores, the bench's own threads included: no sign of competing processes")
    return (f"OS 1-minute load average after each run: median {statistics.median(loads):.1f}, "
            f"max {loads[-1]:.1f} ({busy}).")


def summarize_runs(runs: list[RunResult]) -> list[MethodSummary]:
    """One summary per (prompt set, temperature, method), in report order."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        groups.setdefault((r.prompt_set, r.temperature, r.method), []).append(r)
    index = {(r.prompt_set, r.temperature, r.method, r.prompt_index, r.round): r for r in runs}
    out = []
    for (set_name, temp, method), rs in sorted(groups.items(),
                                               key=lambda kv: (kv[0][0], kv[0][1], _report_order(kv[0][2]))):
        alone = f"{runtime_of(method)}:ar" if runtime_of(method) else "hf-generate"
        band, noise = _ratio_band(rs, index, "hf-generate"), _round_spread(rs, index, alone)
        by_prompt = _by_prompt(rs)
        out.append(MethodSummary(
            method=method, prompt_set=set_name, temperature=temp, runs=len(rs),
            tokens_per_s=_per_prompt_median(by_prompt, lambda r: r.tokens_per_s),
            wall_tokens_per_s=_per_prompt_median(by_prompt, lambda r: r.new_tokens / (r.wall_s or r.seconds)),
            speedup=band.median if band else math.nan, speedup_lo=band.lo if band else math.nan,
            speedup_hi=band.hi if band else math.nan, vs_assisted=_median_ratio(rs, index, "hf-assisted"),
            vs_best_hf=_median_ratio(rs, index, *BEST_HF),
            tokens_per_call=statistics.median(r.tokens_per_call for r in rs),
            new_tokens=sum(r.new_tokens for r in rs), **_split(rs), **_equality(rs),
            first_token_s=_per_prompt_median(by_prompt, lambda r: r.first_token_s),
            decode_tokens_per_s=_per_prompt_median(by_prompt, _decode),
            decode_speedup=_median_ratio(rs, index, "hf-generate", rate=_decode),
            decode_vs_best_hf=_median_ratio(rs, index, *BEST_HF, rate=_decode),
            vs_runtime_alone=_median_ratio(rs, index, alone),
            prompts=len(by_prompt), rounds=max(len(v) for v in by_prompt.values()),
            round_spread=noise,
        ))
    return out


def _by_prompt(rs: list[RunResult]) -> dict[int, list[RunResult]]:
    out: dict[int, list[RunResult]] = {}
    for r in rs:
        out.setdefault(r.prompt_index, []).append(r)
    return out


def _per_prompt_median(by_prompt: dict[int, list[RunResult]], value: Callable[[RunResult], float | None]) -> float:
    """Median over prompts of each prompt's median over its rounds (values that are missing are left out)."""
    return _median(_median(value(r) for r in rs) for rs in by_prompt.values())


def _decode(r: RunResult) -> float | None:
    return r.decode_tokens_per_s


def _median(values) -> float:
    """Median of the values that are there (nan if none is: e.g. runs from a bench file without them)."""
    have = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(have) if have else math.nan


def _round_ratios(rs: list[RunResult], index: dict, others: tuple[str, ...],
                  rate: Callable[[RunResult], float | None]) -> dict[int, tuple[float, ...]]:
    """Prompt index -> the ratios of ``rate`` to the fastest of ``others``, one per round, each paired with
    the runs of the same prompt and round (rounds where a rate is missing are left out)."""
    mine: dict[int, list[float]] = {}
    bases: dict[int, list[float]] = {}
    for r in rs:
        base = [index.get((r.prompt_set, r.temperature, o, r.prompt_index, r.round)) for o in others]
        if rate(r) is None or any(b is None or rate(b) is None for b in base):
            continue
        mine.setdefault(r.prompt_index, []).append(rate(r))
        bases.setdefault(r.prompt_index, []).append(max(rate(b) for b in base))
    paired = {i: rounds.paired_ratios(mine[i], bases[i]) for i in mine}
    return {i: ratios for i, ratios in paired.items() if ratios}


def _ratio_band(rs: list[RunResult], index: dict, *others: str,
                rate: Callable[[RunResult], float | None] = lambda r: r.tokens_per_s) -> rounds.Spread | None:
    """Per-prompt ratios of ``rate`` (tokens/s) to the fastest of methods ``others`` on the same prompt (each
    the median of its rounds' paired ratios): their median and range over the prompts (None where none of them
    ran there, or a rate is missing)."""
    per_prompt = [statistics.median(v) for v in _round_ratios(rs, index, others, rate).values()]
    return rounds.spread(per_prompt) if per_prompt else None


def _round_spread(rs: list[RunResult], index: dict, *others: str) -> float:
    """Median over prompts of the half range of its rounds' ratios, relative to their median (nan: fewer than
    two rounds anywhere)."""
    halves = [rounds.spread(v).half_width for v in _round_ratios(rs, index, others, lambda r: r.tokens_per_s).values()
              if len(v) > 1]
    return statistics.median(halves) if halves else math.nan


def _median_ratio(rs: list[RunResult], index: dict, *others: str,
                  rate: Callable[[RunResult], float | None] = lambda r: r.tokens_per_s) -> float:
    """Median over prompts of ``rate`` relative to the fastest of ``others`` on the same prompt (nan: none)."""
    band = _ratio_band(rs, index, *others, rate=rate)
    return band.median if band is not None else math.nan


def _split(rs: list[RunResult]) -> dict:
    if any(r.steps is None for r in rs):
        return dict(draft_frac=None, verify_frac=None, other_frac=None, outside_frac=None)
    draft, verify, other = (sum(getattr(r, k) for r in rs) for k in ("draft_s", "verify_s", "other_s"))
    steps = (draft + verify + other) or 1.0
    wall = sum(r.seconds for r in rs) or 1.0
    return dict(draft_frac=draft / steps, verify_frac=verify / steps, other_frac=other / steps,
                outside_frac=sum(r.outside_steps_s for r in rs) / wall)


def _equality(rs: list[RunResult]) -> dict:
    flags = [r.matches_reference for r in rs if r.matches_reference is not None]
    if not flags:
        return dict(mismatches=None, compared=None)
    return dict(mismatches=sum(not f for f in flags), compared=len(flags))


# ---------------------------------------------------------------------------- JSON
def to_dict(result: BenchResult) -> dict:
    return {
        "format": FORMAT, "pair": result.pair, "device": result.device, "started": result.started,
        "seconds": result.seconds, "clock": result.clock, "config": asdict(result.config),
        "trees": [t.to_dict() for t in result.trees], "profile": result.profile,
        "profile_reason": result.profile_reason,
        "summary": [_finite(asdict(s)) for s in summarize_runs(result.runs)],
        "runs": [r.to_dict() for r in result.runs],
    }


def read_runs(path: str | Path) -> list[RunResult]:
    """The runs of a bench JSON file (e.g. to merge partial benches or redraw their charts)."""
    data = read_json(path, FORMAT, "Sequoia bench")
    fields = set(RunResult.__dataclass_fields__)
    return [RunResult(**{**{k: v for k, v in r.items() if k in fields}, "tokens": tuple(r["tokens"])})
            for r in data["runs"]]


def _finite(d: dict) -> dict:
    """JSON has no NaN: missing ratios become null."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


# ---------------------------------------------------------------------------- Markdown
_COLUMNS = ("prompts", "T", "method", "tokens/s", "vs target alone", "vs assisted", "first token (s)",
            "decode tokens/s", "decode vs target", "tokens/call", "draft / verify / other", "greedy = target")


def markdown_table(summaries: list[MethodSummary], wall_column: bool = False) -> str:
    """One row per (prompt set, temperature, method); medians over prompts.

    ``wall_column`` adds wall-clock tokens/s beside the main column (for benches timed on the process clock);
    a *vs best HF* column follows *vs assisted* when both Hugging Face drafting baselines ran.
    """
    best_column = any(not math.isnan(s.vs_best_hf) for s in summaries)
    runtime_column = any(runtime_of(s.method) for s in summaries)
    noise_column = any(s.rounds > 1 for s in summaries)
    columns = (_COLUMNS[:4] + (("wall tokens/s",) if wall_column else ()) + _COLUMNS[4:5]
               + (("round to round",) if noise_column else ()) + _COLUMNS[5:6]
               + (("vs best HF",) if best_column else ()) + (("vs its runtime alone",) if runtime_column else ())
               + _COLUMNS[6:])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for s in summaries:
        split = ("-" if s.draft_frac is None else
                 f"{s.draft_frac:.0%} / {s.verify_frac:.0%} / {s.other_frac:.0%}")
        equal = "-" if s.compared is None else f"{s.compared - s.mismatches}/{s.compared}"
        count = f"{s.prompts or s.runs}" + (f" x {s.rounds} rounds" if s.rounds > 1 else "")
        cells = (f"{s.prompt_set} ({count})", f"{s.temperature:g}", s.method, f"{s.tokens_per_s:.2f}",
                 *((f"{s.wall_tokens_per_s:.2f}",) if wall_column else ()),
                 _x_band(s.speedup, s.speedup_lo, s.speedup_hi, s.prompts or s.runs),
                 *((_pm(s.round_spread),) if noise_column else ()),
                 _x(s.vs_assisted), *((_x(s.vs_best_hf),) if best_column else ()),
                 *((_x(s.vs_runtime_alone),) if runtime_column else ()),
                 _num(s.first_token_s), _num(s.decode_tokens_per_s), _x(s.decode_speedup),
                 f"{s.tokens_per_call:.2f}", split, equal)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def combined_lines(summaries: list[MethodSummary]) -> list[str]:
    """One line per (prompt set, temperature): ``sequoia-ngram`` over the better of prompt lookup and assisted."""
    return [f"- {s.prompt_set}, T={s.temperature:g}: {_x(s.vs_best_hf)} the better of HF prompt lookup and "
            f"HF assisted, {_x(s.speedup)} the target alone ({s.tokens_per_s:.2f} tokens/s); after the first "
            f"token {_x(s.decode_vs_best_hf)} and {_x(s.decode_speedup)}"
            for s in summaries if s.method == "sequoia-ngram" and not math.isnan(s.vs_best_hf)]


def markdown_report(result: BenchResult) -> str:
    cfg = result.config
    head = [
        f"# Bench: {result.pair}", "",
        f"{result.device}; {cfg.max_new_tokens} new tokens; "
        f"temperatures {', '.join(f'{t:g}' for t in cfg.temperatures)}; "
        + (f"{cfg.rounds} interleaved rounds per prompt; " if cfg.rounds > 1 else "")
        + f"{result.seconds / 60:.1f} min in all (started {result.started}).", "",
        "Medians over the prompts of each set.  *tokens/s*: absolute; *vs target alone*: tokens/s over "
        "`hf-generate` (target alone) on the same prompt, its range over the prompts in brackets; "
        + ("*round to round*: how much a row's ratio to its own runtime's target alone moved between the rounds "
           "of one prompt (half its range, the median over prompts: the machine's noise); " if cfg.rounds > 1 else "")
        + "*vs assisted*: over `hf-assisted`; *vs best HF*: over "
        "the faster of `hf-assisted` and `hf-prompt-lookup` on that prompt; *first token*: time to the first "
        "output (mostly the prompt's forward, alike for every method); *decode tokens/s*: the rate after it, "
        "and *decode vs target* its per-prompt ratio to the target alone's; *tokens/call*: new tokens per "
        "target forward (prefill included); the split is of the engine's step time (step 0, the prompt's "
        "forward, included); "
        "*greedy = target*: outputs equal to target-only greedy at T=0.", "",
    ]
    if result.profile_reason:
        head += [f"Hardware profile: {result.profile_reason}.", ""]
    if result.clock == "process":
        head += ["Timed on the **process clock**: every run's duration (tokens/s, speedups, the step split) is "
                 "this process's CPU time with one torch thread, i.e. what the run takes on a core "
                 "of its own; *wall tokens/s* is what the busy shared machine actually delivered.", ""]
    summaries = summarize_runs(result.runs)
    head += [markdown_table(summaries, wall_column=result.clock == "process")]
    combined = combined_lines(summaries)
    if combined:
        head += ["Combined method (`sequoia-ngram`: copied branches + the dynamic tree), medians of per-prompt "
                 "ratios:", "", *combined, ""]
    methods = list(dict.fromkeys(r.method for r in result.runs))
    head += ["Methods: " + "; ".join(f"`{m}` {LABEL_OF.get(m, m)}" for m in methods) + ".", ""]
    loads = [r.load1 for r in result.runs if r.load1 is not None]
    if loads:
        head += [load_line(loads, os.cpu_count() or 1), ""]
    if result.trees:
        head += ["Sequoia trees (optimizer's choice):", ""]
        for t in result.trees:
            head.append(f"- {t.prompt_set}, T={t.temperature:g}: {t.tree.size} tokens, depth {t.tree.depth}, "
                        f"predicted {t.expected_tokens:.2f} tokens/step and {t.predicted_speedup:.2f}x "
                        f"(acceptance: {t.acceptance_source})")
        head.append("")
    return "\n".join(head)


def write_markdown(result: BenchResult, path: str | Path) -> None:
    Path(path).write_text(markdown_report(result))


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _x_band(v: float, lo: float, hi: float, prompts: int) -> str:
    """A median ratio with its range over the prompts ("1.23x (0.91-1.52)"; alone for one prompt)."""
    if math.isnan(v) or prompts < 2 or math.isnan(lo):
        return _x(v)
    return f"{v:.2f}x ({lo:.2f}-{hi:.2f})"


def _pm(v: float) -> str:
    """A relative half range as "+-4%" ("-" for none)."""
    return "-" if math.isnan(v) else f"±{100 * v:.0f}%"


def _num(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"
