"""Tiny random-weight models of real architectures and a byte-level tokenizer, built in code:
what the tests, the benchmarks and the GPU check run specscope's whole pipeline on without a
download. Their weights are random (the output layer sharpened so that distributions are peaked
like a trained LM's); nothing measured on them says anything about a real pair."""

from __future__ import annotations

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """A byte-level tokenizer: one token per byte, three chat special tokens and a chat
    template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model(
    arch: str,
    vocab_size: int,
    seed: int,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 1024,
) -> torch.nn.Module:
    """A float32 random model of ``arch`` (``llama`` or ``qwen2``) on the CPU, in eval mode, on
    SDPA attention; the same ``seed`` gives the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"
    model = model_cls(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked distributions, like a trained LM's
    return model


def near_pair(
    arch: str, vocab_size: int, noise: float = 0.05, seed: int = 7
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(draft, target): a tiny 2-layer target and a draft made from it by multiplicative noise
    on every weight, near it (noise 0.05: many nodes accepted) or far from it (noise 1.0)."""
    target = tiny_model(arch, vocab_size, seed=2)
    draft = tiny_model(arch, vocab_size, seed=2)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.mul_(1 + noise * torch.randn_like(p))
    return draft, target
