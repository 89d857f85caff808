"""The proposers beyond a static tree: the dynamic tree and its growth, n-gram copies, the price gate, the prompt's fit.
Imports sequoia.core, sequoia.runners and the engine room (sequoia.runtime.drafter); never measuring or checks.
"""
