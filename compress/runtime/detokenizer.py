"""Output text of a sequence, for streaming and stop strings."""

from compress.runtime.sequence import Sequence


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def text(self, seq: Sequence) -> str:
        """The output text, cut before the first stop string. While the sequence runs, a trailing
        incomplete character and a tail that could begin a stop string are held back, so that what
        was streamed is never taken back."""
        text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in seq.params.stop) if i >= 0), default=-1)
        if cut >= 0:
            return text[:cut]
        if seq.finished:
            return text
        text = text.rstrip("\ufffd")
        hold = max((len(s) - 1 for s in seq.params.stop), default=0)
        return text[: len(text) - hold]

    def hits_stop(self, seq: Sequence) -> bool:
        text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        return any(s in text for s in seq.params.stop)
