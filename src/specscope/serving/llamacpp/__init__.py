"""llama.cpp end to end: its programs, llama-server, its export and logs, and the llama-server
backend of ``tune`` and ``bench``.

- :mod:`.programs`: build llama-server, llama-bench and llama-quantize; run llama-bench and
  llama-quantize;
- :mod:`.server`: llama-server as a backend (:class:`~.server.ServerSetting`, the exact flags;
  :class:`~.server.LlamaServer`, one process);
- :mod:`.router`: llama-server's router mode (presets), draft agreement, greedy-chain counts;
- :mod:`.costs`: llama.cpp's pass costs (llama-bench curves) and the break-even points of chains;
- :mod:`.backend`: candidate settings timed in llama-server, as the bench's rows;
- :mod:`.study`: ``tune`` and ``bench --backend llama-server``: the tune, and the bench's plan;
- :mod:`.export`: a tuned policy as llama-server flags and a router-mode presets file;
- :mod:`.ingest`: llama-server's per-request ``timings`` as request statistics (statistics key
  ``timings``).

The modules are imported one by one (this package's ``__init__`` imports none of them), so reading
a llama-server log does not load the study's dependencies.
"""
