"""Where specscope meets a serving engine (vLLM, SGLang, llama.cpp, TensorRT-LLM, transformers).

Organised by engine, with what every engine shares beside them:

- :mod:`.vllm`, :mod:`.sglang`: each engine's export rules (``export``) and its per-request
  statistics parser with the key of those statistics in an answer (``ingest``);
- :mod:`.trtllm`, :mod:`.hf_transformers`: the export rules of engines specscope reads no logs of;
- :mod:`.llamacpp`: llama.cpp end to end: its programs (build, llama-bench, llama-quantize), the
  llama-server backend of tune and bench, router mode, pass costs, its export and its log
  parser;
- :mod:`.specbench`: Spec-Bench's answer files, a log format without an engine;
- shared: :mod:`.export` (the engines' registry, ``export_policy``), :mod:`.export_plan` (one
  configuration per routed domain), :mod:`.export_rules` (engine versions and their checks),
  :mod:`.request_stats` (what every parser returns, the checks they share), :mod:`.ingest` (the
  formats' registry, reading logs, writing ingested runs), :mod:`.gateway` (``specscope gateway``).

Registries are dicts keyed by engine name (``export.ENGINES``, ``ingest.FORMATS``). In this package
"engine" means a serving engine and nothing else. Node-level acceptance is measured elsewhere
(:mod:`specscope.measure`); nothing here imports a module of it.
"""
