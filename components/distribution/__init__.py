"""The Distribution check tab: its run in chunks with Stop, and the figure of each rule's verdict.
Imports components.app_state and components.widgets; never another tab.
"""
