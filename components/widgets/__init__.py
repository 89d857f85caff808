"""Figures and HTML shared by several tabs: pure functions from records, trees and profiles to Plotly or HTML.
Imports sequoia.core (and components' colours) only; never Gradio, a model or another components package.
"""
