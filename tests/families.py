"""Tiny configs of every family we run, with every optional feature switched on: the transformers config
keyword arguments a test adds to ``tiny_hf``'s sizes (hidden 64, 4 heads / 2 KV heads, 2 layers)."""

# A window shorter than the tests' prompts, yarn and longrope past their original contexts, partial rotary,
# both soft-caps, head_dim apart from hidden / heads, Gemma 3's local rope base beside a scaled global one.
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 6},
    "qwen2": {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    "qwen3": {"head_dim": 24, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1, "max_position_embeddings": 64,
              "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0}},
    "gemma2": {"head_dim": 24, "query_pre_attn_scalar": 20, "sliding_window": 6, "attn_logit_softcapping": 0.05,
               "final_logit_softcapping": 0.5},
    "gemma3_text": {"head_dim": 24, "query_pre_attn_scalar": 20, "sliding_window": 6, "attn_logit_softcapping": 0.05,
                    "final_logit_softcapping": 0.5, "layer_types": ["sliding_attention", "full_attention"],
                    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    "phi3": {"sliding_window": 6, "max_position_embeddings": 64, "original_max_position_embeddings": 16,  # wins over rope_parameters'
             "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "original_max_position_embeddings": 16, "short_factor": [1.0, 1.2, 1.5, 2.0],
                                 "long_factor": [1.5, 2.5, 4.0, 8.0]}},
    "olmo2": {},
    "granite": {"embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.05, "logits_scaling": 2.5,
                "attention_bias": True},
}
NEW = ("qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "granite")

# Mixtures of experts (kept apart: tests that iterate FAMILIES assume a dense MLP in every layer). 4 experts, 2 per
# token; Qwen2-MoE with its shared expert and one dense layer (decoder_sparse_step 2: layer 0 dense, layer 1 sparse).
MOE_FAMILIES = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 6},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
                  "decoder_sparse_step": 2, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "norm_topk_prob": True, "head_dim": 24,
                  "mlp_only_layers": [0]},
}
