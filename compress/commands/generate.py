"""`compress generate`: one prompt, streamed to the terminal."""

import sys

from compress.errors import UserError
from compress.models import load_tokenizer, resolve
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


def chat_prompt(tokenizer, prompt: str) -> list[int]:
    if not tokenizer.chat_template:
        raise UserError("--chat: this model's tokenizer has no chat template; run without --chat")
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def run_generate(model: str, prompt: str, params: dict, chat: bool, engine: dict) -> None:
    """Stream the completion of prompt to stdout (engine messages go to stderr); engine: LLM keyword arguments.
    One request of known length: unless the user sets it, the KV pool holds that request's tokens, not a share
    of free memory (Qwen3-8B's default pool was 1.4 GiB for a 20-token answer)."""
    sampling = SamplingParams(**params)  # bad options fail before the model loads
    if not prompt:
        raise UserError("the prompt is empty")
    model_dir = resolve(model)
    tokenizer = load_tokenizer(model_dir)
    request = chat_prompt(tokenizer, prompt) if chat else tokenizer.encode(prompt)
    if engine.get("max_model_len") is None and engine.get("kv_cache_memory") is None:
        lookahead = (engine.get("num_speculative_tokens") or 0) + 1  # a verification's draft tokens
        engine = {**engine, "max_model_len": len(request) + sampling.max_tokens + lookahead}
    llm = LLM(model_dir, max_num_seqs=1, **engine)
    for delta in llm.stream(request, sampling):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
