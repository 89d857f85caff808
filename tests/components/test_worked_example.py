"""The worked example (components.live.worked_example): one rejection on five tokens, by the engine's own rule."""

from __future__ import annotations

import pytest
import torch

from components.live import worked_example as we
from sequoia.core.verification.sampling import acceptance_probability


def test_the_shipped_example_rejects_the_drafts_word_and_resamples_from_the_residual():
    ex = we.work()
    assert ex.vocab[ex.child] == "floor" and not ex.accepted            # the lesson's case (holds SEED)
    assert ex.chance == pytest.approx(0.10 / 0.70) and ex.u >= ex.chance
    gaps = torch.clamp(torch.tensor(ex.p) - torch.tensor(ex.q), min=0)
    assert ex.residual == pytest.approx((gaps / gaps.sum()).tolist())   # norm(max(p - q, 0))
    assert ex.residual == pytest.approx([0.25 / 0.6, 0.25 / 0.6, 0.0, 0.05 / 0.6, 0.05 / 0.6], abs=1e-6)
    assert ex.residual[ex.emitted] > 0 and ex.vocab[ex.emitted] == "sofa"


def test_the_same_seed_gives_the_same_numbers_and_an_accepted_case_has_no_residual():
    assert we.work() == we.work()
    always = we.work(p=(0.0, 0.0, 1.0, 0.0, 0.0), q=(0.0, 0.0, 1.0, 0.0, 0.0))
    assert always.accepted and always.residual == () and always.emitted == always.child
    assert always.chance == acceptance_probability(1.0, 1.0) == 1.0
    with pytest.raises(ValueError, match="one entry per token"):
        we.work(p=(0.5, 0.5), q=we.Q)


def test_the_emitted_word_is_distributed_as_p_over_seeds():
    """The figure's promise (min(p, q) + P(reject) x residual = p), checked by running the example's rule."""
    counts = torch.zeros(5)
    for seed in range(4000):
        counts[we.work(seed=seed).emitted] += 1
    assert torch.allclose(counts / counts.sum(), torch.tensor(we.P), atol=0.03)


def test_the_figure_shows_p_q_and_the_residual_with_their_numbers():
    ex = we.work()
    fig = we.figure(ex)
    names = [t.name for t in fig.data]
    assert names == ["target p", "draft q", "residual norm(max(p − q, 0))"]
    assert list(fig.data[0].x) == list(we.VOCAB) and list(fig.data[2].text)[1] == "0.42"
    assert "u = " in fig.layout.title.text and "<b>rejected</b>" in fig.layout.title.text
    assert any("★" in a.text for a in fig.layout.annotations)
    md = we.markdown(ex)
    assert "| floor | 0.10 | 0.70 | -0.60 | 0.00 | 0.000 |" in md and "**sofa**" in md
