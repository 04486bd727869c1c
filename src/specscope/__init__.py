"""specscope: acceptance dynamics of tree-based speculative decoding.

The library is organised one package or module per concern (docs/explanation/layout.md lists
every module):

- ``trees``     draft trees as parents arrays, their derived buffers, and growth policies
- ``models``    draft/target pairs: hub ids, local directories, GGUF files, the embedded demo pair
- ``prompts``   prompt items, their sources and domains (code, math, reasoning, chat, ...)
- ``core``      the one speculation loop: prefill -> draft -> verify -> accept -> commit
- ``decode``    real speculative decoding: greedy and sampled acceptance
- ``measure``   measurement: record every node of every step's tree
- ``records``   run directories and their Parquet schemas
- ``run``       ``specscope run``: a run's config, manifest and resumable measurement
- ``sweep``     grids of runs, their shards and executors
- ``tune``      choosing speculation: optimal trees, costs, per-domain policies, routers, the bench
- ``analysis``  the paper's tables, corrected metrics, statistics, plots and reports
- ``theory``    acceptance criteria and their KL certificates
- ``serving``   serving engines: exports, imported logs, the gateway, llama.cpp end to end
- ``doctor``    what this machine has (``hardware``: its CPU)
- ``cli``       the ``specscope`` command, a thin layer over the above
"""

__version__ = "0.1.0"
