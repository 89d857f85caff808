"""The GPU check's results as a Markdown page (tables a reader compares at a glance)."""

from __future__ import annotations

from .costs import NS


def markdown(result: dict) -> str:
    v = result.get("versions", {})
    lines = ["# GPU check", "",
             f"Device: {v.get('gpu') or v.get('cpu', '?')} ({v.get('device')}); torch {v.get('torch')}"
             f"{', CUDA ' + str(v['cuda']) if v.get('cuda') else ''}; transformers {v.get('transformers')}; "
             f"Python {v.get('python')}; started {result.get('started', '?')}.", ""]
    if "correctness" in result:
        lines += _correctness(result["correctness"])
    if "costs" in result:
        lines += _costs(result["costs"])
    if "host" in result:
        lines += _host(result["host"])
    if "draft" in result:
        lines += _draft(result["draft"])
    return "\n".join(lines) + "\n"


def _correctness(c: dict) -> list[str]:
    out = ["## (a) Correctness (tiny fp32 models)", "", "| check | result | passed |", "|---|---|---|"]
    for kind in c.get("kinds", []):
        g, t = c.get(f"greedy_{kind}", {}), c.get(f"tree_vs_chain_{kind}", {})
        out.append(f"| greedy output = target's greedy generate ({kind} runner) | {g.get('equal')}/{g.get('runs')} "
                   f"| {_ok(g)} |")
        out.append(f"| {t.get('nodes')}-node tree vs each node's chain ({kind}) | max abs diff "
                   f"{t.get('max_abs_diff', float('nan')):.2e} | {_ok(t)} |")
        out += [f"| ↳ {f} | | |" for f in g.get("failures", [])]
    ge = c.get("graph_vs_eager", {})
    out.append(f"| graph replay vs eager forward ({ge.get('graphs')} graphs) | max abs diff "
               f"{ge.get('max_abs_diff', float('nan')):.2e} | {_ok(ge)} |")
    for k, e in ge.get("capture_errors", {}).items():
        out.append(f"| ↳ capture failed {k} | {e} | |")
    d = c.get("distribution", {})
    for name, p in d.get("p_values", {}).items():
        out.append(f"| chi-square of the sampled joint, {name} ({d.get('trials')} runs) | p = {p:.3g} | "
                   f"{'yes' if p > d.get('alpha', 0) else 'NO'} |")
    if "broken_residual_p" in d:
        p = d["broken_residual_p"]
        out.append(f"| broken residual (the foil: must fail) | p = {p:.3g} | {'yes' if p < d['alpha'] else 'NO'} |")
    out += ["", f"All passed: **{c.get('passed')}** ({c.get('seconds', 0):.0f} s).", ""]
    return out


def _costs(c: dict) -> list[str]:
    head = "| " + " | ".join(str(n) for n in NS) + " |"
    out = ["## (b) Costs (random bf16 weights)", "",
           f"{c.get('ctx')} cached tokens; wall ms of one forward of n new tokens (host work included), median.", "",
           "| model, runner | " + head[2:], "|---|" + "---|" * len(NS)]
    for kind, ms in c.get("draft_forward_ms", {}).items():
        out.append(f"| {c.get('draft')}, {kind} | " + " | ".join(f"{x:.2f}" for x in ms) + " |")
    for name, t in c.get("targets", {}).items():
        for kind, ms in t.get("forward_ms", {}).items():
            out.append(f"| {name}, {kind} | " + " | ".join(f"{x:.2f}" for x in ms) + " |")
    for name, t in c.get("targets", {}).items():
        out += _target(name, t, c.get("draft", ""))
    return out


def _target(name: str, t: dict, draft: str) -> list[str]:
    p, e, pr = t.get("profile", {}), t.get("engine", {}), t.get("projection", {})
    ar, seq = e.get("ar") or {}, e.get("sequoia_code_t0") or {}
    out = ["", f"### Target {name} ({t.get('params_b')} B parameters), draft {draft}", "",
           f"Profile measured in {p.get('seconds', 0):.1f} s: step overhead {p.get('step_overhead_ms', 0):.2f} ms, "
           f"level overhead {p.get('level_overhead_ms', 0):.2f} ms.", "",
           "| engine step | measured ms/step | predicted | draft ms (per level) | verify ms | other ms |",
           "|---|---|---|---|---|---|"]
    if ar:
        out.append(f"| target alone (ar) | {ar['step_ms']:.2f} | {e.get('predicted_ar_step_ms', 0):.2f} | - | "
                   f"{ar['verify_ms']:.2f} | {ar['other_ms']:.2f} |")
    if seq:
        out.append(f"| Sequoia, code T=0 tree ({pr.get('tree')}) | {seq['step_ms']:.2f} | "
                   f"{e.get('predicted_sequoia_step_ms') or 0:.2f} | {seq['draft_ms']:.2f} "
                   f"({seq['draft_level_ms']:.2f}) | {seq['verify_ms']:.2f} | {seq['other_ms']:.2f} |")
    out += ["", f"Projected Sequoia (code, T=0: {pr.get('expected_tokens', 0):.2f} tokens a step): "
                f"**{pr.get('sequoia_tokens_per_s', 0):.0f} tokens/s, {pr.get('speedup', 0):.2f}x** the target "
                f"alone on graphs ({pr.get('target_alone_tokens_per_s', 0):.0f} tokens/s).", "",
            "| baseline | tokens/s | ms/token |", "|---|---|---|"]
    for bname, b in t.get("baselines", {}).items():
        out.append(f"| {bname} | {b['tokens_per_s']:.1f} | {b['ms_per_token']:.2f} |" if "tokens_per_s" in b
                   else f"| {bname} | failed: {b.get('error')} | |")
    out += ["", "| acceptance vector | tree (budget, depth) | tokens/step | predicted speedup |", "|---|---|---|---|"]
    for label, ch in t.get("choices", {}).items():
        out.append(f"| {label} | {ch['budget']}, {ch['depth']} | {ch['expected_tokens']:.2f} | "
                   f"{ch['speedup']:.2f}x |")
    return out


def _host(h: dict) -> list[str]:
    out = ["", "## (c) Host work per engine step (tiny fp32 models, graph runner)", "",
           "Median ms per step; host = the step minus its forwards (each drained), the draft's and the verify's "
           "share of it, and the engine's other; torch operators and scalar reads (each a host wait on a GPU) "
           "outside the forwards.  On a CPU, one thread.", "",
           "| tree, temperature | step | forwards | host | draft host | verify host | other | ops | scalar reads |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, r in h.get("rows", {}).items():
        out.append(f"| {name} | {r['step_ms']:.2f} | {r['forward_ms']:.2f} | **{r['host_ms']:.2f}** | "
                   f"{r['draft_host_ms']:.2f} | {r['verify_host_ms']:.2f} | {r['other_ms']:.2f} | "
                   f"{r['ops_outside_forwards']:.0f} | {r['scalar_reads']:.0f} |")
    return out + [""]


def _draft(d: dict) -> list[str]:
    out = ["", f"## (d) The draft alone: {d.get('draft')}, {d.get('tree')} (code T=0 DP tree)", "",
           f"Uncompiled runner: {d.get('capture')}.", "",
           "Median ms of one draft (the root's forward excluded): the whole tree as one program (one graph replay "
           "on CUDA) against one replay per level with sampling and inputs eager between.", "",
           "| forward | sampling, draft | draft ms | ms a level |", "|---|---|---|---|"]
    c = d.get("compile", {})
    for what, timed in (("uncompiled", d.get("uncompiled")), ("compiled", c.get("warm", {}).get("timings"))):
        label = what if what == "uncompiled" or not c.get("unavailable") else "uncompiled (child process)"
        for name, r in (timed or {}).get("rows", {}).items():
            out.append(f"| {label} | {name} | {r['draft_ms']:.2f} | **{r['level_ms']:.2f}** |")
    if c:
        out += ["", f"Compiling: {'unavailable (' + c['unavailable'] + ')' if c.get('unavailable') else c.get('key')}.",
                "", "| start | compile s | captures s | compiles (dynamo graphs, FX cache hits / misses) | compile "
                "| process s |", "|---|---|---|---|---|---|"]
        for start in ("cold", "warm"):
            r = c.get(start)
            if r is not None:
                n = r.get("compiles") or {}
                counts = f"{n['graphs']}, {n['fx_cache_hits']} / {n['fx_cache_misses']}" if n else "?"
                secs = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
                out.append(f"| {start} | failed: {r['error']} | | | | |" if "error" in r else
                           f"| {start} | {secs} | {r['warm_up_s']:.1f} | {counts} | {r['compile']} | "
                           f"{r['process_s']:.1f} |")
    return out + [""]


def _ok(d: dict) -> str:
    return "yes" if d.get("passed") else "NO"
