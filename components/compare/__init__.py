"""The Compare tab: the methods it offers, the comparison in rounds, its figures and table, exact mode.
Imports components.app_state and components.widgets; never another tab.
"""
