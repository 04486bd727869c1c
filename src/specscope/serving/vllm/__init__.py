"""vLLM: what specscope writes for it and reads from it.

- :mod:`.export`: a tuned policy as one ``--speculative-config`` per domain, checked against the
  vLLM versions its rules were read from;
- :mod:`.ingest`: vLLM's per-request speculative-decoding metrics as request statistics (the
  format ``specscope ingest --format vllm`` and the gateway read; its statistics key ``metrics``).

Nothing here starts vLLM.
"""
