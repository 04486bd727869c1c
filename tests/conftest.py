"""Tiny random models of real architectures and a tiny byte-level tokenizer, built in code."""

from __future__ import annotations

import pytest
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer():
    """A byte-level tokenizer: one token per byte, plus three chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(arch: str, vocab_size: int, seed: int, layers: int = 2, hidden: int = 64):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(seed)
    kind = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    config_cls, model_cls = kind[arch]
    config = config_cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=1024, tie_word_embeddings=False,
                        eos_token_id=None, bos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    model = model_cls(config).eval()
    # Sharpen the random output layer so that distributions are peaked like a real LM's.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tokenizer):
    """Saved tiny draft/target checkpoints per architecture, loadable like any local model."""
    dirs = {}
    for arch in ("llama", "qwen2"):
        for role, seed, layers in (("draft", 1, 1), ("target", 2, 2)):
            path = tmp_path_factory.mktemp(f"{arch}-{role}")
            make_model(arch, len(tokenizer), seed, layers).save_pretrained(path)
            tokenizer.save_pretrained(path)
            dirs[arch, role] = path
    return dirs


def spine_nodes(rates: dict[str, list[float]], prompts: int = 4, steps: int = 50):
    """A spine of depth D per step whose top-1 node at depth d is accepted with the given
    rate (deterministically: the first round(rate * steps) steps of each prompt)."""
    rows = []
    for domain, r in rates.items():
        for p in range(prompts):
            for s in range(steps):
                for d, rate in enumerate(r, start=1):
                    rows.append({"prompt_id": f"{domain}{p}", "domain": domain, "step": s,
                                 "node_id": d - 1, "parent_id": d - 2, "depth": d,
                                 "sibling_rank": 0, "greedy_accept": s < round(rate * steps)})
    import pandas as pd

    return pd.DataFrame(rows)
