"""The smaller disagreements of issue 58, each where a test can hold it: the Hardware tab names the runtime that
serves, Measure reads the load average the right way round, the cost chart draws 'linear in n' as a line, the
summary's tokens a call name their difference from its tokens a step, step mode prints a zero p as 0 with its
reason, a run without a tree is priced with the vector of its temperature, and the target alone's rate is one
per condition (drawn on the page or not), named by the run that measured it."""

from dataclasses import replace

from components.app_state import target_rate
from components.app_state.target_rate import CoreWait, TargetRate, TargetRates
from components.hardware import runners_view
from components.live import inspector_view, stats_view, step_mode
from components.widgets import hardware_view, projection_view
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.statistics.trace import NodeCheck, StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime.measuring.finder import AcceptanceEntry

COST = hardware_view.CostSeries((1, 2, 4, 8, 16), (40.0, 60.0, 100.0, 190.0, 380.0), (1, 2, 4), (20.0, 30.0, 45.0),
                                label="llama.cpp")


# ------------------------------------------------------------------ Hardware tab
def test_the_runner_section_names_the_runtime_that_serves():
    llama = runners_view.RunnerCurves("cpu", eager=COST, backend="llamacpp")
    words = runners_view.runners_markdown(llama)
    assert words.startswith("This server runs llama.cpp") and "the curves are llama.cpp's forwards" in words
    assert "runs eagerly here" not in words and "eager runner's" not in words
    assert runners_view.runners_figure(llama).layout.title.text == "llama.cpp runtime"
    assert "no profile of it is measured yet" in runners_view.runners_markdown(replace(llama, eager=None))
    hf = runners_view.runners_markdown(runners_view.RunnerCurves("cpu", eager=COST))
    assert hf == f"{runners_view.CPU_NOTE}; the curves are the eager runner's."


def test_measure_reads_the_cores_sharing_from_the_kernel_not_the_load_average():
    """Issue 58: "the load average was 2.5 on 2 cores: the cores were not shared much".  The load counts Measure's
    own threads (a 2-thread decode alone on 2 cores reads 2): the words now come from the time its threads waited
    for a core another program held, with the figure."""
    shared = hardware_view.cores_words(hardware_view.CoresWait(0.42, 5.6))
    assert shared.startswith("other programs shared the cores") and "42% of their busy time (5.6 s" in shared
    quiet = hardware_view.cores_words(hardware_view.CoresWait(0.03, 0.2))
    assert quiet.startswith("the cores were not shared much") and "3%" in quiet
    assert hardware_view.cores_words(None) == "" and "load average" not in shared + quiet


def test_the_cost_chart_draws_linear_cost_as_a_line():
    """Log x with linear y bent 'linear in n' into a steep curve; on log-log axes it is a slope-1 line."""
    fig = hardware_view.cost_figure(COST, chosen_n=3)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    linear = next(t for t in fig.data if t.name.startswith("target if linear in n"))
    assert "slope 1 on log axes" in linear.name
    lo, hi = fig.layout.yaxis.range
    assert 10 ** lo < min(COST.draft_ms) and 10 ** hi > max(COST.target_ms)    # every measured point in view
    chosen = next(t for t in fig.data if t.name.startswith("chosen"))
    assert min(chosen.y) > 0                                                 # drawable on a log axis


# ------------------------------------------------------------------ Live summary and step mode
def _run():
    chain = Tree.chain(5)
    first = replace(StepRecord.fake(Tree.root_only(), (0,), step=0), prompt_tokens=4, verify_s=0.2)
    step = replace(StepRecord.fake(chain, tuple(range(6)), step=1), verify_s=0.05, draft_s=0.03)
    return [first, step]


def test_tokens_a_call_name_their_difference_from_tokens_a_step():
    """'7 tokens in 2 target calls · 3.50 tokens/step' beside 'why: 6.0 tokens per target call'."""
    records = _run()
    summary = stats_view.summary_markdown(records)
    assert "**7 tokens** in **2 target calls** · **3.50** tokens/step" in summary
    line = stats_view.speedup_markdown(records, TargetRate(10.0, True, "measured on this prompt"))
    assert "why: 6.0 tokens per target call at" in line
    assert "(the calls after the prompt's forward; the 3.50 tokens/step above count that forward's call too)" in line


def test_the_target_alones_work_at_a_slower_call_says_why():
    alone = Tree.root_only()
    records = [replace(StepRecord.fake(alone, (0,), step=i), draft_s=0.0, verify_s=0.06, other_s=0.0)
               for i in range(4)]
    line = stats_view.speedup_markdown(records, TargetRate(1 / 0.045, True, "measured on this prompt"))
    assert "1.0 tokens per target call at 60.0 ms a call, against 1 token at 45.0 ms for the target alone" in line
    assert ": the same work, 15.0 ms a call slower: this method's own work around each call" in line
    fast = stats_view.speedup_markdown(records, TargetRate(1 / 0.06, True, "measured on this prompt"))
    assert "the same work" not in fast


def test_a_zero_p_prints_as_0_with_its_reason():
    assert inspector_view.significant(0.0, 3) == "0"
    p, q, chance, u = inspector_view.rule_numbers(0.0, 0.25, 0.4)
    assert (p, chance) == ("0", "0") and float(u) == 0.4
    rec = StepRecord.fake(Tree.chain(1), (0,))   # node 1 tested and rejected: outside the target's top-p
    rec = replace(rec, checks=(NodeCheck(1, 0, 0.4, 0.0, 0.25, False, (5, 6), (), (0.0, 1.0), (0.25, 0.75)),),
                  status=("accepted", "rejected"))
    words = step_mode.markdown(rec, next(i for i, ph in enumerate(step_mode.phases(rec)) if ph.kind == "test"))
    assert "min(1, 0 / 0.250) = 0" in words and "p is exactly 0" in words and "0.00" not in words


def test_a_run_without_a_tree_is_priced_with_the_vector_it_names_and_its_temperature():
    here = HardwareProfile.hand_made(lambda n: 30.0 * n, lambda w: 10.0)
    plain = [StepRecord.fake(Tree.root_only(), (0,), step=i) for i in range(3)]
    chat = AcceptanceEntry("chat, T=0.7 (embedded-chat-t07)", None, "chat", 0.7, (0.6, 0.2))
    head = projection_view.projection_lines(plain, here, (), chat, temperature=0.7)[0]
    assert "chat prompts' measured acceptance (T=0.7, “chat, T=0.7 (embedded-chat-t07)”)" in head
    assert "code prompts" not in head and "where no offered vector" not in head
    code = AcceptanceEntry("code, T=0 (embedded-code-greedy)", None, "code", 0.0, (0.6, 0.2))
    head = projection_view.projection_lines(plain, here, (), code, temperature=0.7)[0]
    assert "this run sampled at T=0.7, where no offered vector was measured" in head


# ------------------------------------------------------------------ one target-alone rate per condition
def test_the_rates_are_kept_one_per_condition_and_picked_by_it():
    rates, key = TargetRates(), ("target", (1, 2, 3), 0.0, 1.0)
    probe = TargetRate(23.2, True, "measured on this prompt (3 runs of 10 tokens, in the server, not drawn)")
    rates.put(key, probe)
    assert target_rate.pick(rates, key, drawn=True) is probe        # the other condition, its source says so
    live = target_rate.live_rate([StepRecord.fake(Tree.root_only(), (0,), step=i) for i in range(5)])
    assert live.drawn and "measured by a Live run of the target alone on this prompt (5 target calls, drawn" in \
        live.source and "this run" not in live.source
    rates.put(key, live)
    assert target_rate.pick(rates, key, drawn=True) is live and target_rate.pick(rates, key, drawn=False) is probe
    assert rates.get(key) is live and len(rates) == 2               # the latest of the two, when either will do


def test_the_time_the_cores_were_held_elsewhere_is_said_with_its_figures():
    probe = TargetRate(23.2, True, "measured on this prompt (in the server, not drawn)")
    words = target_rate.drawing_words(CoreWait(run_s=10.4, wait_s=5.6, wall_s=8.0), probe)
    assert words.startswith("**Cores shared during this run**: the server's threads, ready to compute, waited for a "
                            "core another program held 35% of their busy time (5.6 s waiting against 10.4 s on a "
                            "core over 8.0 s")
    assert "roughly 1.54× its time with the cores to itself" in words and "measured without drawing" in words
    rounds = target_rate.drawing_words(CoreWait(10.4, 5.6, 8.0), probe, drawn=False, what="this comparison's rounds")
    assert rounds.startswith("**Cores shared during this comparison's rounds**") and "without drawing" not in rounds
    assert target_rate.drawing_words(CoreWait(10.0, 0.5, 6.0), probe) == ""      # hardly shared: nothing said
    assert target_rate.drawing_words(None, probe) == ""
    before = {1: (100, 50)}
    assert target_rate.core_wait(before, {1: (1_000_000_100, 500_000_050), 2: (10, 0)}, 2.0) == CoreWait(
        1.00000001, 0.5, 2.0)   # thread 2 started meanwhile: counted from zero
    assert target_rate.core_wait(before, {}, 1.0) is None


def test_compares_sharing_note_follows_how_the_rounds_were_timed():
    from components.compare import compare_tab, compare_view

    rows = compare_view.mark_identical([
        compare_view.CompareRow("Target alone", 16, 4.0, 16, (1,), rates=(4.0, 3.9, 4.3)),
        compare_view.CompareRow("Chain", 16, 3.0, 6, (1,), rates=(5.0, 5.2, 4.8))])
    shared = target_rate.drawing_words(CoreWait(55.0, 76.4, 68.3), None, drawn=False,
                                       what="this comparison's timed rounds")
    md = compare_tab._notes_markdown(rows, [], 0.0, shared=shared)
    assert md.index("Identical at T=0") < md.index("Timed in 3 interleaved rounds") < md.index(
        "**Cores shared during this comparison's timed rounds**: the server's threads, ready to compute, waited for a "
        "core another program held 58% of their busy time")
    assert "Cores shared" not in compare_tab._notes_markdown(rows, [], 0.0)
