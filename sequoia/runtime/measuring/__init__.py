"""Measuring a pair and a machine: acceptance, calibration, hardware profiles, timing, fingerprints, the finder,
the runtime chosen by measurement (the targets alone timed at start and in the background), a ZeroGPU call's
size.  Imports sequoia.core, sequoia.runners, the engine room, the proposers and the checks (teacher forcing, the
baselines it times).
"""
