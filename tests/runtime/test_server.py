"""The OpenAI-compatible server on the tiny random model, driven by the official openai client."""

import json
import time

import httpx
import openai
import pytest
import torch

from compress.bench.loadtest import metric
from compress.runtime import SamplingParams
from compress.runtime.local_server import running_server
from tests.runtime.conftest import make_llm

KEY = "sk-test"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return make_llm(tiny_dir, blocks=256)


@pytest.fixture(scope="module")
def server(llm):
    with running_server(llm, api_key=KEY, max_body_bytes=64 << 10) as (url, engine):
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


def greedy(client, **kw):
    return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, **kw)


def test_completion_equals_the_engine_and_reports_usage(client, llm):
    res = greedy(client)
    ids = llm.tokenizer.encode(PROMPT)
    expected = llm.generate([ids], SamplingParams(max_tokens=12, temperature=0))[0]
    assert res.choices[0].text == expected.text
    assert res.choices[0].finish_reason == expected.finish_reason
    assert res.usage.prompt_tokens == len(ids)
    assert res.usage.completion_tokens == len(expected.token_ids)
    assert res.usage.total_tokens == len(ids) + len(expected.token_ids)
    assert res.object == "text_completion" and res.model == "tiny"


def test_stream_chunks_concatenate_to_the_non_streaming_text(client):
    full = greedy(client).choices[0].text
    chunks = list(greedy(client, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_several_prompts_give_one_choice_each_in_order(client):
    res = client.completions.create(model="tiny", prompt=[PROMPT, "Hello"], max_tokens=5, temperature=0)
    assert [c.index for c in res.choices] == [0, 1]
    assert res.choices[0].text == greedy(client).choices[0].text[:len(res.choices[0].text)]


def test_chat_stream_equals_chat(client):
    messages = [{"role": "user", "content": "Say hi"}]
    res = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == res.choices[0].message.content
    assert res.choices[0].message.role == "assistant" and res.object == "chat.completion"
    assert res.usage.completion_tokens == 10 and res.choices[0].finish_reason == "length"


def test_stop_string_cuts_the_text(client):
    full = greedy(client).choices[0].text
    stop = full[3:6]
    res = greedy(client, stop=[stop])
    assert res.choices[0].finish_reason == "stop"
    assert res.choices[0].text == full[:full.find(stop)]


def test_seed_reproduces_a_sample(client):
    def sample(seed):
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed).choices[0].text
    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_echo_logprobs_score_the_prompt_as_transformers_does(client, llm, hf_tiny):
    ids = llm.tokenizer.encode(PROMPT)
    res = client.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=2)
    lp = res.choices[0].logprobs
    with torch.no_grad():
        ref = hf_tiny(torch.tensor([ids])).logits[0].log_softmax(-1)  # [T, V]
    expected = [ref[p - 1, ids[p]].item() for p in range(1, len(ids))]
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 1
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-4)
    greedy_next = ref[-1].argmax().item()
    assert lp.token_logprobs[-1] == pytest.approx(ref[-1, greedy_next].item(), abs=1e-4)
    assert max(lp.top_logprobs[-1].values()) == pytest.approx(lp.token_logprobs[-1])
    assert res.choices[0].text.startswith(llm.tokenizer.decode(ids))


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server[0] + "/health").status_code == 200
    metrics = httpx.get(server[0] + "/metrics").text
    for name in ("compress_num_requests_running", "compress_kv_blocks_total", "compress_prefix_cache_hit_rate",
                 "compress_num_preemptions_total", "compress_generation_tokens_total",
                 'compress_time_to_first_token_seconds_bucket{le="+Inf"}', "compress_inter_token_latency_seconds_count",
                 "compress_e2e_request_latency_seconds_sum"):
        assert name in metrics


def post(server, path: str, body, key: str | None = KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server[0] + path, content=content, headers={**headers, "Content-Type": "application/json"}, **kw)


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    ({"model": "tiny", "prompt": PROMPT, "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": PROMPT, "n": 2}, 400, "n"),
    ({"model": "tiny", "prompt": PROMPT * 200}, 400, None),  # longer than the 256-token context
    ({"model": "tiny", "prompt": ""}, 400, "prompt"),
    ({"model": "gpt-4", "prompt": PROMPT}, 404, "model"),
    ({"model": "tiny", "prompt": "x" * (70 << 10)}, 413, None),
])
def test_bad_requests_get_openai_errors_and_the_server_lives_on(server, client, body, status, param):
    res = post(server, "/v1/completions", body)
    assert res.status_code == status
    error = res.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert greedy(client).choices[0].finish_reason == "length"


def test_api_key_is_required_on_v1_routes(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1}
    assert post(server, "/v1/completions", body, key=None).status_code == 401
    assert post(server, "/v1/completions", body, key="wrong").status_code == 401
    assert httpx.get(server[0] + "/v1/models").status_code == 401
    assert post(server, "/v1/completions", body).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server[0] + "/v1", api_key="wrong", max_retries=0).models.list()


def test_without_api_key_anyone_on_loopback_is_served(llm):
    with running_server(llm) as (url, _):
        res = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 2
        assert httpx.get(url + "/v1/nope").json()["error"]["type"] == "invalid_request_error"


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    url = server[0]
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    aborted = metric(url, 'compress_request_success_total{finished_reason="abort"}')
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as res:
        lines = res.iter_lines()
        assert next(lines).startswith("data: ")
        assert metric(url, "compress_kv_blocks_used") > 0
    assert wait_for(lambda: metric(url, "compress_kv_blocks_used") == 0)
    assert metric(url, 'compress_request_success_total{finished_reason="abort"}') == aborted + 1
    assert metric(url, "compress_num_requests_running") == 0


def test_a_full_waiting_queue_answers_429(tiny_dir):
    llm = make_llm(tiny_dir, blocks=64, max_num_seqs=1)
    long = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with running_server(llm, max_waiting=1) as (url, engine), httpx.Client(timeout=30) as http:
        with http.stream("POST", url + "/v1/completions", json=long) as running:
            lines = running.iter_lines()  # kept: a discarded line iterator closes the response (a disconnect)
            next(lines)  # the first request holds the only running slot
            with http.stream("POST", url + "/v1/completions", json=long) as waiting:
                assert wait_for(lambda: engine.num_waiting == 1)
                res = http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
                assert res.status_code == 429 and res.json()["error"]["code"] == "queue_full"
                assert waiting.status_code == 200
        assert wait_for(lambda: metric(url, "compress_kv_blocks_used") == 0)


@pytest.mark.slow
def test_smollm2_chat_over_the_server_equals_the_engine(smollm2_dir):
    from compress.runtime import LLM

    llm = LLM(smollm2_dir, kv_cache_memory=64 << 20)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)
    expected = llm.generate([ids], SamplingParams(max_tokens=24, temperature=0))[0]
    with running_server(llm, name="smollm2") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        res = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
        streamed = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0,
                                                  stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed)
    assert res.choices[0].message.content == expected.text == text
    assert "Paris" in expected.text
    assert res.usage.prompt_tokens == len(ids) and res.usage.completion_tokens == len(expected.token_ids)


def test_server_with_a_draft_gives_the_same_text_and_counts_acceptance(tiny_dir, client):
    expected = greedy(client).choices[0].text
    with running_server(make_llm(tiny_dir, draft=tiny_dir, num_speculative_tokens=3)) as (url, _):
        spec = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert greedy(spec).choices[0].text == expected
        assert "".join(c.choices[0].text for c in greedy(spec, stream=True) if c.choices) == expected
        accepted, drafted = (metric(url, f"compress_spec_decode_{n}_tokens_total") for n in ("accepted", "draft"))
    assert accepted == drafted > 0  # the target is its own draft
