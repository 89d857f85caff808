"""The pure algorithms, torch and numpy only: trees and the DP, verification, requests, profiles and costs, n-grams,
statistics; ``config`` the generation settings every layer shares.  Imports nothing of the project but sequoia._meta.
"""
