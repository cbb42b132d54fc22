"""The tokenizer written into a GGUF is the one llama.cpp's converter writes (checked against the built-in file), and a
SentencePiece-style one tokenizes as the source does when transformers (and llama.cpp, where installed) read it back."""

import json
from pathlib import Path

import pytest

from compress.errors import UserError
from compress.gguf.vocab import BYTE, CONTROL, NORMAL, UNKNOWN, add_vocab, llama_cpp_model, pre_tokenizer, tokenizer_json
from tests.conftest import DATA, save_hf, tiny_hf

# No run of spaces: transformers' LlamaTokenizer takes a leading "▁" from its own Metaspace, not from tokenizer.json's
# normalizer (where llama.cpp, and tokenizers reading the file, put one more before leading spaces).
TEXTS = ["Hello world, the capital of France.", "a newline\nand a tab\tthere", "caf\u00e9 \u00fc \U0001F600 3.14159",
         "The Valkyria Chronicles III"]


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


def test_other_tokenizers_are_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace"}}))
    with pytest.raises(UserError, match="Unigram model without byte fallback"):
        llama_cpp_model(tokenizer_json(tmp_path))
    with pytest.raises(UserError, match="needs the model's tokenizer.json"):
        tokenizer_json(tmp_path / "missing")


@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory) -> Path:
    """A Llama-2-style tokenizer (BPE with byte fallback, "▁" for spaces, <unk> <s> </s> and 256 byte tokens first)
    trained here on WikiText-2 text, saved as transformers saves LlamaTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import LlamaTokenizerFast

    if not (DATA / "wikitext2" / "wiki.test.raw").is_file():
        pytest.skip(f"shared data not found at {DATA}")
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    text = (DATA / "wikitext2" / "wiki.test.raw").read_text()[:200_000].splitlines()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=800, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    out = tmp_path_factory.mktemp("spm") / "tokenizer"
    LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(out)
    return out


def test_sentencepiece_tokenizer_reads_back_the_same(tmp_path, sentencepiece_dir):
    from transformers import AutoTokenizer

    from compress.commands.quantize_gguf import run_quantize_gguf
    from compress.quant.config import QuantConfig

    src = save_hf(tiny_hf("llama", vocab=800), tmp_path / "src", sentencepiece_dir)
    path = run_quantize_gguf(str(src), QuantConfig(method="rtn", format="gguf", gguf_type="F32"), str(tmp_path / "m.gguf"))
    import gguf

    fields = {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if k.startswith("tokenizer")}
    assert fields["tokenizer.ggml.model"] == "llama" and fields["tokenizer.ggml.add_space_prefix"] is True
    types, scores, tokens = fields["tokenizer.ggml.token_type"], fields["tokenizer.ggml.scores"], fields["tokenizer.ggml.tokens"]
    assert types[:3] == [UNKNOWN, CONTROL, CONTROL] and set(types[3:259]) == {BYTE} and set(types[259:]) == {NORMAL}
    assert fields["tokenizer.ggml.bos_token_id"] == 1 and fields["tokenizer.ggml.eos_token_id"] == 2
    assert fields["tokenizer.ggml.add_bos_token"] is True
    normal = [s for s, t in zip(scores, types) if t == NORMAL]
    assert len(set(normal)) == len(normal)  # one merge order, no ties
    source = AutoTokenizer.from_pretrained(sentencepiece_dir)
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=Path(path).name)  # rebuilt from tokens and scores
    assert back.convert_ids_to_tokens(list(range(800))) == tokens
    for text in TEXTS:
        assert back(text, add_special_tokens=False).input_ids == source(text, add_special_tokens=False).input_ids, text
    try:
        import llama_cpp
    except ImportError:
        return
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(sentencepiece_dir / "tokenizer.json"))  # the file itself, spaces as its normalizer says
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in [*TEXTS, "  two  spaces"]:
        assert llm.tokenize(text.encode(), add_bos=True) == raw.encode(text).ids, text
