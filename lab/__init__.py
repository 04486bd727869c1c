"""Code that checks specscope itself: the calibration of its verdicts on data of known truth
(:mod:`lab.calibration`), synthetic runs of known structure (:mod:`lab.synthetic`), a
measurement's stages timed from outside (:mod:`lab.stages_timing`) and llama-server's router mode
with its counters replayed (:mod:`lab.llama_router`).

It is not installed with the package and no ``specscope`` command reaches it: the tests,
``benchmarks/`` and ``scripts/`` import it from a checkout's root (pytest puts the root on the
path; ``python -m lab.calibration`` runs there). It imports specscope; nothing in specscope
imports it.
"""
