"""The tokenizer as llama.cpp reads it: tokens, their types, merges or scores, special ids and the chat template.

Byte-level BPE tokenizers (Llama 3, Qwen, SmolLM, Mistral Nemo) are written as convert_hf_to_gguf.py writes
them ("gpt2" model). llama.cpp picks its pre-tokenizer regex by the name in tokenizer.ggml.pre, which the
converter finds by hashing the token ids of one test text: the same hash and names are used here.

SentencePiece-style BPE tokenizers (Llama 2, Mistral 7B v0.1-v0.3, TinyLlama: tokenizer.json's BPE with
byte_fallback, "▁" for spaces) are written as llama.cpp's "llama" model: tokens with scores, and llama.cpp
merges the adjacent pair whose merged token scores highest. The scores are read off tokenizer.json's merges
(a token made by merge r scores -r: SentencePiece's own BPE scores rank its pieces the same way; characters no
merge makes score below every merge), so llama.cpp and transformers' GGUF reader, which rebuilds the merges
from the scores, merge in the tokenizer's order. Byte tokens <0xXX> are BYTE, <unk> UNKNOWN, both score 0.
"""

import json
from hashlib import sha256
from pathlib import Path

from compress.errors import UserError

# convert_hf_to_gguf.py's test text (get_vocab_base_pre), character for character.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001F680 (normal) \U0001F636\u200d\U0001F32B\uFE0F (multiple emojis "
    "concatenated) \u2705 \U0001F999\U0001F999 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001F601 ?\u6211\u60f3\u5728apple"
    "\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440"
    "\u0441\u043a\u0438 ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll "
    "make it, 'D you like some tea? We'Ve a'lL"
)
# sha256 of str(token ids of CHKTXT) -> llama.cpp's pre-tokenizer name, for the families we write.
PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen 1.5 to 3
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM, SmolLM2
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral Nemo
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType


def pre_tokenizer(tokenizer) -> str:
    """llama.cpp's name for the pre-tokenizer of ``tokenizer`` (a ``tokenizers.Tokenizer``: tokenizer.json as it is,
    whatever class transformers would wrap it in for the checkpoint's model_type)."""
    digest = sha256(str(tokenizer.encode(CHKTXT).ids).encode()).hexdigest()
    if digest not in PRE_TOKENIZERS:
        raise UserError(f"--format gguf: this tokenizer's pre-tokenizer is not one llama.cpp names (hash {digest[:12]}); "
                        "convert it with llama.cpp's convert_hf_to_gguf.py or use --format compressed-tensors")
    return PRE_TOKENIZERS[digest]


def looks_special(token: str) -> bool:
    return token.startswith(("<|", "<\uff5c")) and token.endswith(("|>", "\uff5c>"))


def token_list(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """(tokens, types) for ids 0..vocab_size-1; ids the tokenizer lacks are "[PAD{i}]" UNUSED (the embedding has rows for them)."""
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif token in added:
            tokens.append(token)
            types.append(CONTROL if decoder[i].special or looks_special(token) else USER_DEFINED)
        else:
            tokens.append(token)
            types.append(NORMAL)
    return tokens, types


def tokenizer_json(model_dir: Path) -> dict:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"--format gguf needs the model's tokenizer.json ({model_dir} has none)")
    return json.loads(path.read_text())


def llama_cpp_model(tok: dict) -> str:
    """llama.cpp's tokenizer model for a tokenizer.json: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)."""
    model = tok.get("model", {})
    if model.get("type") == "BPE" and "ByteLevel" in json.dumps(tok.get("pre_tokenizer")):
        return "gpt2"
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return "llama"
    raise UserError("--format gguf writes byte-level BPE (Llama 3, Qwen, SmolLM) and SentencePiece BPE (Llama 2, Mistral) "
                    f"tokenizers; this one is a {model.get('type')} model without byte fallback: convert it with llama.cpp's "
                    "convert_hf_to_gguf.py")


def merge_scores(merges: list) -> dict[str, float]:
    """token -> -r for the first merge r that makes it."""
    scores = {}
    for r, merge in enumerate(merges):
        token = "".join(merge.split(" ", 1) if isinstance(merge, str) else merge)
        scores.setdefault(token, -float(r))
    return scores


def scored_tokens(tokenizer, tok: dict, vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) for ids 0..vocab_size-1 of a SentencePiece BPE tokenizer (see the module doc)."""
    tokens, types = token_list(tokenizer, vocab_size)
    merged, unk = merge_scores(tok["model"].get("merges", [])), tok["model"].get("unk_token")
    scores = []
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">") or kind != NORMAL or token == unk:
            scores.append(0.0)
            types[i] = UNKNOWN if token == unk else BYTE if token.startswith("<0x") and len(token) == 6 else kind
        else:
            scores.append(merged.get(token, -float(len(merged) + i)))
    return tokens, scores, types


def space_prefix(tok: dict) -> bool:
    """Whether the tokenizer puts "▁" before the text (a Prepend normalizer, or a Metaspace that prepends)."""
    pre = tok.get("pre_tokenizer") or {}
    metaspace = [p for p in [pre, *pre.get("pretokenizers", [])] if p.get("type") == "Metaspace"]
    return '"Prepend"' in json.dumps(tok.get("normalizer")) or any(m.get("prepend_scheme", "always") != "never" for m in metaspace)


def add_vocab(writer, model_dir: Path, vocab_size: int) -> None:
    """Write the tokenizer of ``model_dir`` into ``writer`` (a gguf.GGUFWriter before its header is written)."""
    import gguf
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = tokenizer_json(model_dir)
    kind = llama_cpp_model(tok)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    writer.add_tokenizer_model(kind)
    if kind == "gpt2":
        tokens, types = token_list(tokenizer, vocab_size)
        writer.add_tokenizer_pre(pre_tokenizer(Tokenizer.from_file(str(model_dir / "tokenizer.json"))))
    else:
        tokens, scores, types = scored_tokens(tokenizer, tok, vocab_size)
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(scores)
        writer.add_add_space_prefix(space_prefix(tok))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=kind == "gpt2", n_vocab=vocab_size)
    ids = tokenizer("a")["input_ids"]  # whether the tokenizer itself adds BOS, where tokenizer_config.json does not say
    special.add_special_token.setdefault("bos", tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id)
    special.add_to_gguf(writer, quiet=True)
