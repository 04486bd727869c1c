"""Measurement: the paper protocol as an acceptor of the speculation loop (study), what each step
records (records), B prompts at a time (batched), and the recompute-everything oracle (naive)."""
