"""What a pair and a machine are measured to be: acceptance vectors, calibration, hardware profiles, costs, fingerprints,
projections onto other machines, the runtimes a pair can be served on.  Imports sequoia.core's other rooms only.
"""
