"""The page of Sequoia Studio: one package per tab (live, compare, dp_explorer, distribution, hardware), the app's
state and serving (app_state), figures more than one tab draws (widgets).  Imports sequoia only.

This module holds the vocabulary every view shares, so a green node in the tree view and a green token in the
text view mean the same thing: status and method colours, and the page's name of each method.  Views are pure
functions from data (step records, DP tables, profiles) to Plotly figures or HTML; they never load a model.
"""

from __future__ import annotations

from sequoia.core.requests.request import LABEL_OF  # plain data: importing the views loads no model code

#: Node / token status colours shared by every view.
COLORS = {
    "accepted": "#2ca02c",   # draft token accepted by the target
    "rejected": "#d62728",   # verified and rejected
    "unreached": "#b8b8b8",  # never verified (an ancestor or earlier sibling decided first)
    "bonus": "#1f77b4",      # token sampled from the target after the accepted path
    "root": "#555555",       # last committed token, input of this step
    "added": "#ff7f0e",      # overlay: node added vs the static tree
    "dropped": "#2ca02c",    # accepted but cut by the length limit (drawn as an open marker)
}

#: Light backgrounds for the text view (same hues as ``COLORS``).
TEXT_BACKGROUNDS = {
    "accepted": "#c9ecc9",
    "bonus": "#c6dcf2",
    "prompt": "#eeeeee",
}

#: Colours of the decoding methods in comparison charts and curves.
METHOD_COLORS = {
    "ar": "#7f7f7f",
    "target only": "#7f7f7f",
    "target alone": "#7f7f7f",
    "chain": "#9467bd",
    "specinfer": "#8c564b",
    "kary": "#e377c2",
    "binary": "#e377c2",
    "sequoia": "#2ca02c",
    "sequoia-auto": "#2ca02c",
    "sequoia-ngram": "#d81b60",     # copied branches + the draft model's dynamic tree
    "ngram": "#e6ab02",             # copies from the context only
    "hf-generate": "#7f7f7f",
    "hf assisted": "#17becf",
    "hf-assisted": "#17becf",
    "hf prompt lookup": "#1f3b8c",
    "hf-prompt-lookup": "#1f3b8c",
    "llama.cpp target only": "#b15928",   # the same target alone on llama.cpp (Compare's reference row)
    "llama.cpp target alone": "#b15928",
    "sequoia + n-gram copies": "#d81b60",   # Compare's rows, named as its checkboxes
    "n-gram copies only": "#e6ab02",
}


def method_label(name: str) -> str:
    """The page's name for a method (the name itself when unknown)."""
    return LABEL_OF.get(name, name)


def method_color(name: str) -> str:
    """Colour of a method by (case-insensitive) name, grey when unknown."""
    key = name.lower()
    if key in METHOD_COLORS:
        return METHOD_COLORS[key]
    for prefix, color in METHOD_COLORS.items():
        if key.startswith(prefix):
            return color
    return "#bcbd22"
