"""The Hardware tab: this machine's profile, its roofline and runtimes, Measure in rounds.
Imports components.app_state, components.widgets and the Compare tab's rounds runner (components.compare.compare_run).
"""
