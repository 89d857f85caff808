"""The static trees the page runs without anyone choosing them: captured before serving on a GPU.

A graph runner captures every forward shape at load (:func:`sequoia.runners.hf.graphs.capture.warm_up_pair`); a
static tree's whole draft is one more graph per tree (its draft program), which the first request with that
tree would otherwise capture.  These are the trees the page's defaults draft: the guided example's and
Compare's fixed tree, each with the acceptance vector the page preselects for it.
"""

from __future__ import annotations

from pathlib import Path

from sequoia.core.trees.dp import optimal_tree
from sequoia.core.trees.tree import Tree
from sequoia.runtime.measuring.finder import find_acceptance

from components.compare.compare_tab import DEFAULT_BUDGET, DEFAULT_DEPTH
from components.live.live_tab import GUIDED


def served_trees(assets_dir: Path) -> tuple[Tree, ...]:
    """The guided example's tree and Compare's default fixed tree (code prompts; one per shape)."""
    guided = find_acceptance("code", GUIDED["temperature"], assets_dir).values
    compare = find_acceptance("code", 0.0, assets_dir).values
    trees = (optimal_tree(guided, GUIDED["budget"], GUIDED["depth"]).tree(),
             optimal_tree(compare, DEFAULT_BUDGET, DEFAULT_DEPTH).tree())
    return tuple(dict.fromkeys(trees))   # Tree is frozen: equal shapes are captured once
