"""The tokenizer written into a GGUF is the one llama.cpp's converter writes (checked against the built-in file)."""

import json

import pytest

from compress.errors import UserError
from compress.gguf.vocab import add_vocab, check_byte_level, pre_tokenizer


def written(tmp_path, model_dir, vocab_size: int) -> dict:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    add_vocab(w, model_dir, vocab_size)
    w.add_tensor_info("x", [32], np.dtype(np.float32), 128)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.write_tensor_data(np.zeros(32, np.float32))
    w.close()
    return {k: f.contents() for k, f in gguf.GGUFReader(str(tmp_path / "v.gguf")).fields.items() if k.startswith("tokenizer")}


def test_smollm2_tokenizer_as_in_its_shipped_gguf(tmp_path, smollm2_dir):
    import gguf

    from compress.models import builtin_gguf

    ours = written(tmp_path, smollm2_dir, 49152)
    shipped = {k: f.contents() for k, f in gguf.GGUFReader(str(builtin_gguf("smollm2-135m"))).fields.items()
               if k.startswith("tokenizer") and k != "tokenizer.ggml.add_space_prefix"}  # a SentencePiece-only key
    assert ours == shipped


def test_unused_ids_are_padded(tmp_path, smollm2_dir):
    fields = written(tmp_path, smollm2_dir, 49160)
    assert fields["tokenizer.ggml.tokens"][-1] == "[PAD49159]" and fields["tokenizer.ggml.token_type"][-1] == 5


def test_pre_tokenizer_by_hash(smollm2_dir):
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    assert pre_tokenizer(Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))) == "smollm"

    class Other:
        def encode(self, text):
            return SimpleNamespace(ids=[1, 2, 3])

    with pytest.raises(UserError, match="pre-tokenizer is not one llama.cpp names"):
        pre_tokenizer(Other())


def test_sentencepiece_style_tokenizer_is_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Metaspace"}}))
    with pytest.raises(UserError, match="SentencePiece-style"):
        check_byte_level(tmp_path)
    with pytest.raises(UserError, match="needs the model's tokenizer.json"):
        check_byte_level(tmp_path / "missing")
