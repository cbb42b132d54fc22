"""The CPU C kernel for paged decode attention against reference.paged_attention (in each x86 build), and its build cache."""

import importlib

import pytest
import torch

from compress.kernels import reference
from tests.kernels.test_paged_attention import OPTIONS, operands
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.paged_attention_cpu")
needs_compiler = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@needs_compiler
@pytest.mark.parametrize("ratio", [1, 3, 8])  # query heads per KV head
@pytest.mark.parametrize("dim", [64, 128, 24])  # the two compiled-in head sizes and the generic loop
def test_matches_reference_ragged(isa, ratio, dim):
    args = operands([1, 17, 40, 16], 2 * ratio, 2, dim)  # 1 token, one past a block, 2.5 blocks, exactly one
    assert_matches(kernel.paged_attention(*args), reference.paged_attention(*args))


@needs_compiler
@pytest.mark.parametrize("softcap, window", OPTIONS)
@pytest.mark.parametrize("ratio, dim", [(1, 64), (4, 128), (3, 24)])  # GQA, each compiled head size
def test_softcap_and_window(isa, softcap, window, ratio, dim):
    q, *rest = operands([1, 17, 40, 70], 2 * ratio, 2, dim, num_blocks=24)
    q = q * 4  # large scores: the cap changes them
    ref = reference.paged_attention(q, *rest, scale=0.5, softcap=softcap, window=window)
    assert_matches(kernel.paged_attention(q, *rest, scale=0.5, softcap=softcap, window=window), ref)


@needs_compiler
def test_window_split_over_threads():
    args = operands([70], 6, 2, 64, num_blocks=16)
    ref = reference.paged_attention(*args, softcap=3.0, window=20)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.paged_attention(*args, softcap=3.0, window=20), ref)
    finally:
        torch.set_num_threads(before)


@needs_compiler
def test_large_scores_custom_scale_and_threads():
    q, k, v, tables, lens = operands([300, 5, 129], 9, 3, 64, num_blocks=64)
    q = q * 8  # softmax dominated by a few tokens: the max subtraction and exp's range matter
    ref = reference.paged_attention(q, k, v, tables, lens, scale=0.3)
    assert_matches(kernel.paged_attention(q, k, v, tables, lens, scale=0.3), ref)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.paged_attention(q, k, v, tables, lens, scale=0.3), ref)
    finally:
        torch.set_num_threads(threads)


@needs_compiler
def test_rejects_inputs_that_would_read_outside_the_cache():
    q, k, v, tables, lens = operands([3, 20], 4, 2, 16)
    with pytest.raises(ValueError, match="block ids"):
        kernel.paged_attention(q, k, v, tables + 100, lens)
    with pytest.raises(ValueError, match="context_lens"):
        kernel.paged_attention(q, k, v, tables, lens + 100)
    with pytest.raises(ValueError, match="context_lens"):
        kernel.paged_attention(q, k, v, tables, lens * 0)
    with pytest.raises(ValueError, match="int32"):
        kernel.paged_attention(q, k, v, tables.long(), lens)
    with pytest.raises(ValueError, match="float32"):
        kernel.paged_attention(q.double(), k, v, tables, lens)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        kernel.paged_attention(q[:, :3], k, v, tables, lens)
    with pytest.raises(ValueError, match="window"):
        kernel.paged_attention(q, k, v, tables, lens, window=-3)


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """load() with an empty cache directory and its memo cleared before and after."""
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    kernel.load.cache_clear()
    yield tmp_path / "kernels"
    kernel.load.cache_clear()


@needs_compiler
def test_builds_once_into_the_cache_and_leaves_no_temporary_files(fresh_build):
    assert kernel.load() is not None
    built = list(fresh_build.iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
    mtime = built[0].stat().st_mtime_ns
    kernel.load.cache_clear()
    assert kernel.load() is not None and built[0].stat().st_mtime_ns == mtime  # loaded, not rebuilt


def test_without_a_working_compiler_the_caller_falls_back(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert kernel.load() is None and not kernel.supports(torch.zeros(1))
    with pytest.raises(RuntimeError, match="cannot be built"):
        kernel.paged_attention(*operands([3], 4, 2, 16))
    assert not fresh_build.exists() or not any(fresh_build.iterdir())
    kernel.load.cache_clear()
    monkeypatch.delenv("CC")
    monkeypatch.setenv("COMPRESS_CPU_KERNELS", "0")
    assert kernel.load() is None


@needs_compiler
@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("kv_heads", [1, 3, 5])
def test_a_sequence_split_over_threads(threads, kv_heads):
    """Fewer sequences than threads: a sequence's KV heads are split over the threads (unevenly where they do
    not divide), with the same result."""
    args = operands([70], 3 * kv_heads, kv_heads, 64, num_blocks=16)
    ref = reference.paged_attention(*args)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert_matches(kernel.paged_attention(*args), ref)
    finally:
        torch.set_num_threads(before)
