"""The Live tab: layout and events, the decode handler and the events after a run, step mode, the worked example
and the projector view.  Imports components.app_state and components.widgets; never another tab.
"""
