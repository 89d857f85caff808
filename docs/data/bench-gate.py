"""The target alone, sequoia-dynamic and sequoia-ngram with and without the price gate, in one process.

The bench CLI names methods, not settings, so this driver builds the two variants with ``make_method(...,
price=None)`` and the default.  For a busy shared machine: ONE torch thread, every timer reads this process's
CPU time (the bench's ``--clock cpu --threads 1`` rule).  Results: docs/data/bench-xeon-amx-gate.md.

    PYTHONPATH=. python docs/data/bench-gate.py PROFILE OUT_JSON [PROMPTS [LIMIT [KIND [DRAFT_SCALE [LABELS]]]]]

DRAFT_SCALE < 1 multiplies the profile's draft costs: a profile that under-prices the draft.
"""
import json, statistics, sys, time
time.perf_counter = time.process_time
import torch
torch.set_num_threads(1)
from sequoia._meta import ASSETS, pair_name
from sequoia.core.config import GenerationConfig
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.acceptance import load_prompts
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.finder import find_acceptance, find_calibration, find_ngram_acceptance, list_acceptance
from sequoia.runtime.methods import make_method
from sequoia.runtime.proposers.price import PriceSettings
from sequoia.runtime.models import load_pair
from sequoia.runtime.measuring.timing import run_with_records, warmup
from sequoia.tools.bench import encode

prof_path, out_path = sys.argv[1], sys.argv[2]
prompts_path = sys.argv[3] if len(sys.argv) > 3 else "docs/data/prompts-retrieval-long.jsonl"
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 3
kind = sys.argv[5] if len(sys.argv) > 5 else "rag"
draft_scale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0   # < 1: a profile that under-prices the draft
pair = load_pair()
name = pair_name(pair)
prof = HardwareProfile.load(prof_path)
if draft_scale != 1.0:
    from dataclasses import replace
    prof = replace(prof, draft_ms=tuple(draft_scale * x for x in prof.draft_ms),
                   contexts=tuple(replace(c, draft_ms=tuple(draft_scale * x for x in c.draft_ms)) for c in prof.contexts))
entry = find_acceptance(kind, 0.0, entries=list_acceptance(ASSETS, name))
cal = find_calibration(0.0, ASSETS, name)
copies = find_ngram_acceptance(kind, 0.0, ASSETS, name)


def build(label):
    price = None if label.endswith("(no gate)") else PriceSettings()
    method = label.split(" ")[0]
    return make_method(method, acceptance=entry.values, profile=prof, calibration=cal, copy_acceptance=copies,
                       price=price)


LABELS = ("hf-generate", "ar", "sequoia-dynamic (no gate)", "sequoia-dynamic", "sequoia-ngram (no gate)",
          "sequoia-ngram")
if len(sys.argv) > 7:
    LABELS = tuple(sys.argv[7].split(","))
engine = SpeculativeEngine(pair, clock=time.process_time)
prompts = [encode(pair, p) for p in load_prompts(prompts_path)[:limit]]
warmup(engine, pair, prompts[0], [(l.split(" ")[0] if l.startswith("hf") else "engine", None if l.startswith("hf") else build(l)) for l in LABELS])
gen = GenerationConfig(max_new_tokens=64)
runs = []
t0 = time.time()
for i, ids in enumerate(prompts):
    order = LABELS[i % len(LABELS):] + LABELS[: i % len(LABELS)]
    for label in order:
        method = label if label.startswith("hf") else "engine"
        prop = None if method.startswith("hf") else build(label)
        recs, res = run_with_records(engine, pair, method, ids, gen, prop)
        gates = [r.dynamic.gate for r in recs if r.dynamic is not None]
        row = {"label": label, "prompt": i, "prompt_tokens": len(ids), "tokens": list(res.tokens),
               "seconds": res.seconds, "first_token_s": res.first_token_s, "decode_tokens_per_s": res.decode_tokens_per_s,
               "tokens_per_s": res.tokens_per_s, "target_calls": res.target_calls,
               "draft_s": res.draft_s, "verify_s": res.verify_s, "other_s": res.other_s,
               "plain_steps": sum(1 for r in recs[1:] if r.tree.size == 0),
               "gate_plain": gates.count("plain"), "gate_small": gates.count("small"),
               "gate_notes": sorted({r.dynamic.gate_note for r in recs if r.dynamic is not None and r.dynamic.gate in ("small", "plain")})}
        runs.append(row)
        print(f"#{i} {label:28s} decode {res.decode_tokens_per_s:6.2f} tok/s  calls {res.target_calls:3d}  "
              f"plain {row['plain_steps']:2d} (gate {row['gate_plain']}, small {row['gate_small']})  {time.time()-t0:.0f}s",
              flush=True)
# Ratios to the target alone (hf-generate) on the same prompt, and greedy equality with it.
ref = {r["prompt"]: r for r in runs if r["label"] == "hf-generate"}
summary = {}
for label in LABELS:
    rows = [r for r in runs if r["label"] == label]
    ratios = [r["decode_tokens_per_s"] / ref[r["prompt"]]["decode_tokens_per_s"] for r in rows]
    summary[label] = {"decode_tokens_per_s_median": statistics.median(r["decode_tokens_per_s"] for r in rows),
                      "decode_vs_target_alone_per_prompt": ratios, "decode_vs_target_alone_median": statistics.median(ratios),
                      "equal_to_target_alone": sum(r["tokens"] == ref[r["prompt"]]["tokens"] for r in rows),
                      "tokens_per_call_median": statistics.median(len(r["tokens"]) / r["target_calls"] for r in rows)}
    print(f"{label:28s} decode {summary[label]['decode_tokens_per_s_median']:.2f} tok/s, "
          f"{summary[label]['decode_vs_target_alone_median']:.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}), "
          f"equal {summary[label]['equal_to_target_alone']}/{len(rows)}")
json.dump({"profile": prof_path, "draft_cost_scale": draft_scale, "acceptance_kind": kind, "pair": name, "prompts": prompts_path, "max_new_tokens": 64, "temperature": 0,
           "threads": 1, "clock": "process", "cpu": "Intel Xeon (Sapphire Rapids class: AVX-512-BF16, AMX), 2 vCPUs, shared",
           "summary": summary, "runs": runs}, open(out_path, "w"), indent=1)
