"""Where specscope meets a serving engine (vLLM, SGLang, llama.cpp, TensorRT-LLM, transformers).

- :mod:`.export`: a tuned policy as each engine's settings, checked against the engine versions;
- :mod:`.ingest`: the engines' per-request speculation logs as runs ``specscope analyze`` reads;
- :mod:`.gateway`: ``specscope gateway``, one endpoint routing requests to per-domain engines;
- :mod:`.llamaserver`: llama.cpp's programs (build, llama-bench, llama-server processes);
- :mod:`.llamacpp`: llama.cpp through llama-cpp-python, pass costs, chain acceptance, settings;
- :mod:`.llamarouter`: llama-server's router mode as a per-domain deployment;
- :mod:`.llamacpp_study`: ``specscope llamacpp``, settings per domain measured side by side.

In this package "engine" means a serving engine and nothing else. Node-level acceptance is
measured elsewhere (:mod:`specscope.measure`); nothing here imports a module of it.
"""
