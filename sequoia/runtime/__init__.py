"""The engine room: the loop (engine), the step's verification and readback (verify), the drafter and the Proposer
protocol, loading a pair (models), memory, every method by name (methods), token texts.  Imports sequoia.core and
sequoia.runners; its rooms (proposers, checks, measuring) sit above it, and only ``methods`` reaches into them.
"""
