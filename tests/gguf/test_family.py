"""What llama.cpp assumes rather than reads must hold in a checkpoint written as GGUF, else one line."""

import pytest

from compress.errors import UserError
from compress.gguf.family import family, hyperparameters
from compress.model.config import ModelConfig


def config(model_type: str, **kw) -> ModelConfig:
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.for_model(model_type, head_dim=256, query_pre_attn_scalar=256, **kw).to_dict())


def test_soft_caps_are_written_where_llama_cpp_applies_them_and_refused_where_it_would_not():
    caps = {k: v for k, v in hyperparameters(config("gemma2", final_logit_softcapping=10.0)).items() if "softcapping" in k}
    assert caps == {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 10.0}
    with pytest.raises(UserError, match="applies the soft-caps attn_logit_softcapping, final_logit_softcapping"):
        family(config("gemma2", attn_logit_softcapping=None))  # llama.cpp would cap at its default 50
    with pytest.raises(UserError, match="applies the soft-caps none"):
        family(config("gemma3_text", final_logit_softcapping=30.0))  # llama.cpp's gemma3 caps nothing
    assert family(config("gemma3_text")).arch == "gemma3"
    assert not any("softcapping" in k for k in hyperparameters(config("gemma3_text")))
