"""The DP explorer tab: solve the tree DP for a chosen acceptance vector and show the table, tree and gains.
Imports components.app_state and components.widgets; never another tab.
"""
