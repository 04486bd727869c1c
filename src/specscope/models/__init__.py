"""Models: what a pair is (config), loading it from the hub, a directory or a GGUF file (load,
gguf), the embedded demo pair (demo), the weights' fingerprints (fingerprint), the
batch-invariant int8 path for CPUs (int8) and tiny random models for tests (tiny)."""

from .config import DEMO_MODELS, ModelLoadError, ModelPair, PairConfig
from .load import load_pair, load_tokenizer, model_identity, resolve_source

__all__ = [
    "DEMO_MODELS",
    "ModelLoadError",
    "ModelPair",
    "PairConfig",
    "load_pair",
    "load_tokenizer",
    "model_identity",
    "resolve_source",
]
