"""`compress generate`: one prompt, streamed to the terminal."""

import sys

from compress.errors import UserError
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


def chat_prompt(tokenizer, prompt: str) -> list[int]:
    if not tokenizer.chat_template:
        raise UserError("--chat: this model's tokenizer has no chat template; run without --chat")
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def run_generate(model: str, prompt: str, params: dict, chat: bool, engine: dict) -> None:
    """Stream the completion of prompt to stdout (engine messages go to stderr); engine: LLM keyword arguments."""
    sampling = SamplingParams(**params)  # bad options fail before the model loads
    if not prompt:
        raise UserError("the prompt is empty")
    llm = LLM(model, max_num_seqs=1, **engine)
    request = chat_prompt(llm.tokenizer, prompt) if chat else prompt
    for delta in llm.stream(request, sampling):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
