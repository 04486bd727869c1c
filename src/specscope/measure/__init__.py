"""Measurement: the driver that commits the target's greedy token per row and records every node
(study), what each step records (records), the checks before a run starts (checks), and the
recompute-everything oracle (naive). The stages it runs are :mod:`specscope.core`'s."""
