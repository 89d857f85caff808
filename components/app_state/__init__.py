"""The app's state and serving: the context and its rooms (pair, profile, extra runners), the work lanes,
request parsing and its memo, run flags, rates.  Imports sequoia and components.widgets only; never a tab.
"""
