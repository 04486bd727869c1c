"""SGLang: what specscope writes for it and reads from it.

- :mod:`.export`: a tuned policy as SGLang server flags per domain, with its node-budget rule
  checked and its approximations said;
- :mod:`.ingest`: SGLang's per-request speculation counts as request statistics (the format
  ``specscope ingest --format sglang`` and the gateway read; its statistics key ``meta_info``).

Nothing here starts SGLang.
"""
