"""Our engine as an lm-eval model (`--backend compress`): every format we export is scored by the
code that serves it.

Tokenization is lm-eval's own (TemplateLM._encode_pair, and HFLM's tok_encode rules for BOS), so
the prompts and token ids equal those of `--backend hf`. The one-token continuations of a context
(a multiple-choice question's answers) are one request for the context, scored at the row after it.
Any other (context, continuation) pair becomes one engine request whose prompt is both and whose
continuation tokens are scored through prompt logprobs; the first request of each context is run
before its siblings, so that the siblings find the context's KV blocks in the prefix cache.
Few-shot prefixes are shared through the prefix cache either way.
"""

from collections import deque

from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from compress.models import resolve
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams
from compress.eval.score_cache import ScoreCache

MAX_ACTIVE_CONTEXTS = 64  # contexts in flight: enough to fill a step, few enough that their blocks stay cached


class CompressLM(TemplateLM):
    def __init__(self, model: str, max_num_batched_tokens: int = 2048, kv_cache_memory: int | None = None,
                 add_bos_token: bool | None = None, cache: bool = True):
        super().__init__()
        model_dir = resolve(model)
        self.llm = LLM(model_dir, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=256,
                       kv_cache_memory=kv_cache_memory)
        self.tokenizer = self.llm.tokenizer
        self.add_bos_token = add_bos_token
        self.cache = ScoreCache(model_dir) if cache else None

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.llm.max_model_len - 1  # one position is left for the token the engine must sample

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        items = []  # (whole token ids truncated from the left, first scored position)
        for _, context, continuation in requests:
            whole = (context + continuation)[-self.max_length:]
            items.append((whole, len(whole) - len(continuation)))
        results: list[tuple[float, bool] | None] = [None] * len(items)
        keys = [ScoreCache.key(whole, start) for whole, start in items] if self.cache else []
        todo = []
        for i in range(len(items)):
            cached = self.cache.get(keys[i]) if self.cache else None
            if cached is None:
                todo.append(i)
            else:
                results[i] = cached
        bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="scoring", disable=disable_tqdm)
        for i, score in self._score([items[i] for i in todo], todo):
            results[i] = score
            if self.cache:
                self.cache.put(keys[i], score)
            bar.update()
        bar.close()
        if self.cache:
            self.cache.commit()
        return results

    def _score(self, items: list[tuple[list[int], int]], labels: list[int]):
        """Yield (label, (logprob, is_greedy)) as requests finish.

        The continuations of one context that are all a single token (a multiple-choice question's
        " A".." D") are one request for the context, scored at the row after it (SamplingParams.
        logprob_token_ids): the context is computed once, as HFLM's logits cache does. Otherwise each
        pair is a request, and the first of each context runs before its siblings."""
        by_context: dict[tuple[int, ...], list[int]] = {}
        for j, (whole, start) in enumerate(items):
            by_context.setdefault(tuple(whole[:start]), []).append(j)
        pending = deque(by_context.items())
        active = {}  # request id -> (seq, items it scores, siblings to submit when it finishes)
        while pending or active:
            while pending and len(active) < MAX_ACTIVE_CONTEXTS:
                context, members = pending.popleft()
                if context and all(len(items[j][0]) == len(context) + 1 for j in members):
                    self._submit_choices(active, context, [items[j][0][-1] for j in members], members)
                else:
                    self._submit(active, items, members[0], members[1:])
            for out in self.llm.step():
                if not out.finished:
                    continue
                seq, members, siblings = active.pop(out.request_id)
                for s in siblings:
                    self._submit(active, items, s, [])
                if seq.params.logprob_token_ids:
                    entry = seq.logprobs[0]
                    for j, token, logprob in zip(members, seq.params.logprob_token_ids, entry.requested):
                        yield labels[j], (logprob, entry.top[0][0] == token)
                else:
                    [j] = members
                    scored = seq.prompt_logprobs[items[j][1]:]
                    yield labels[j], (sum(e.logprob for e in scored), all(e.top[0][0] == e.token_id for e in scored))

    def _submit(self, active: dict, items, j: int, siblings: list[int]) -> None:
        whole, start = items[j]
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, prompt_logprobs=1, score_from=start)
        self._enqueue(active, whole, params, [j], siblings)

    def _submit_choices(self, active: dict, context: tuple[int, ...], tokens: list[int], members: list[int]) -> None:
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=1, logprob_token_ids=tuple(tokens))
        self._enqueue(active, list(context), params, members, [])

    def _enqueue(self, active: dict, prompt: list[int], params: SamplingParams, members: list[int], siblings: list[int]) -> None:
        seq = self.llm.make_sequence(prompt, params)
        self.llm.enqueue(seq)
        active[seq.id] = (seq, members, siblings)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for (string,) in tqdm([r.args for r in requests], desc="rolling loglikelihood", disable=disable_tqdm):
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(string, add_special_tokens=False), self.prefix_token_id, self.max_length, 1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True)
            totals.append(sum(lp for lp, _ in scores))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prompts, params = [], []
        for context, gen_kwargs in [r.args for r in requests]:
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = gen_kwargs.get("max_gen_toks", 256)
            ids = self.tok_encode(context)[-(self.max_length - max_new):]
            temperature = gen_kwargs.get("temperature", 0.0) if gen_kwargs.get("do_sample") else 0.0
            prompts.append(ids)
            params.append(SamplingParams(max_tokens=max_new, temperature=temperature, stop=tuple(until)))
        return [out.text for out in self.llm.generate(prompts, params)]
