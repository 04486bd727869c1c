"""Models: what a pair is (config), loading it from the hub, a directory or a GGUF file (load),
the embedded demo pair (demo), and the batch-invariant int8 path for CPUs (int8)."""

from ..cache import cache_dir
from .config import DEMO_MODELS, ModelLoadError, ModelPair, PairConfig
from .load import load_pair, load_tokenizer, model_identity, resolve_source

__all__ = ["DEMO_MODELS", "ModelLoadError", "ModelPair", "PairConfig", "cache_dir", "load_pair",
           "load_tokenizer", "model_identity", "resolve_source"]
