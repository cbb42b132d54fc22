"""The tokenizer as llama.cpp reads it: tokens, their types, merges, special ids and the chat template.

Byte-level BPE tokenizers (Llama 3, Qwen, SmolLM, Mistral Nemo) are written as convert_hf_to_gguf.py writes
them ("gpt2" model). llama.cpp picks its pre-tokenizer regex by the name in tokenizer.ggml.pre, which the
converter finds by hashing the token ids of one test text: the same hash and names are used here.
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
NORMAL, UNUSED, CONTROL, USER_DEFINED = 1, 5, 3, 4  # gguf.TokenType


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


def check_byte_level(model_dir: Path) -> None:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"--format gguf needs the model's tokenizer.json ({model_dir} has none)")
    tok = json.loads(path.read_text())
    pre = json.dumps(tok.get("pre_tokenizer"))
    if tok.get("model", {}).get("type") != "BPE" or "ByteLevel" not in pre:
        raise UserError("--format gguf writes byte-level BPE tokenizers (Llama 3, Qwen, SmolLM, Mistral Nemo); this one "
                        "is a SentencePiece-style tokenizer: convert it with llama.cpp's convert_hf_to_gguf.py")


def add_vocab(writer, model_dir: Path, vocab_size: int) -> None:
    """Write the tokenizer of ``model_dir`` into ``writer`` (a gguf.GGUFWriter before its header is written)."""
    import gguf
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    check_byte_level(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens, types = token_list(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer(Tokenizer.from_file(str(model_dir / "tokenizer.json"))))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=vocab_size)
    ids = tokenizer("a")["input_ids"]  # whether the tokenizer itself adds BOS, where tokenizer_config.json does not say
    special.add_special_token.setdefault("bos", tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id)
    special.add_to_gguf(writer, quiet=True)
