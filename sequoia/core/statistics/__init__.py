"""What a run produced and what it says: step records, run statistics, timing rounds with bands, counts in words.
Imports sequoia.core's other rooms only (no model code).
"""
