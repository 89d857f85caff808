"""Token trees and the choice of one: the Tree, attention masks, the DP, the optimizer, the SGLang family.
Imports sequoia.core's other rooms only (no model code).
"""
