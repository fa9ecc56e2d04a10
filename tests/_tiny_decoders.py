"""A small random Llama or Qwen2 model (transformers' classes) for the fused-forward tests:
two layers, width 32, four heads, weights moved off their init so that every term of the
forward matters, biases included."""

import torch


def random_decoder(tok, arch: str, kv_heads: int, bias: bool, tied: bool, seed: int,
                   max_positions: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads, intermediate_size=48,
                  max_position_embeddings=max_positions, tie_word_embeddings=tied,
                  pad_token_id=tok.pad_token_id)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(attention_bias=bias, mlp_bias=bias, **common))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model
