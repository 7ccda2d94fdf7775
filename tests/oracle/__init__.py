"""Independent oracles: plain Python loops written from the spec, no vectorised tricks.

Each builder's tests compare every field in the valid region with these.
"""
