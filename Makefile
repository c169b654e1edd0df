# make test / make run set everything up from nothing: a .venv with the package, a pinned CPU torch
# (override: make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
# and, for the browser tests, Debian's chromium.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
PORT ?= 8501
ADDRESS ?= 127.0.0.1# this machine only; another address reads no server path until roots are set (docs/serving.md)

.PHONY: test run bench lint venv browser clean

$(BIN)/.ready: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[app,test,ray]"
	# the [compare] extra (verl, for tests/test_presets_verl.py) without its heavy dependencies; skips if offline
	$(BIN)/pip install -q --no-deps "verl==0.9.1" || echo "verl unavailable: tests/test_presets_verl.py will skip"
	# ms-swift and ART likewise, for tests/test_presets_own_code.py (ART's newest release declares Python >= 3.12;
	# the test reads one file of it, art/loss.py, which runs on 3.10+)
	$(BIN)/pip install -q --no-deps "ms-swift==4.6.0" || echo "ms-swift unavailable: its own-code tests will skip"
	$(BIN)/pip install -q --no-deps --ignore-requires-python "openpipe-art==0.5.23" \
	  || echo "openpipe-art unavailable: its own-code tests will skip"
	# frameworks whose presets tests/test_presets_frameworks.py checks against their own code: wheels unzipped under
	# .venv/frameworks, never installed (their packages would shadow ours); skips if offline
	$(BIN)/pip download -q --no-deps -d $(VENV)/frameworks "trl==1.16.0" "openrlhf==0.11.2" "skyrl==0.3.0" \
	  "areal==1.0.4" && for w in $(VENV)/frameworks/*.whl; do \
	  $(BIN)/python -m zipfile -e $$w $(VENV)/frameworks/$$(basename $$w | cut -d- -f1); done \
	  || echo "framework wheels unavailable: tests/test_presets_frameworks.py will skip"
	touch $@

venv: $(BIN)/.ready

# plotly.js's cartesian bundle for the explorer (a third of the full one; without npm the full one is served)
PLOTLY_BUNDLE := app/static/plotly-cartesian.min.js
$(PLOTLY_BUNDLE): $(BIN)/.ready
	-$(BIN)/python app/ui/plotly_js.py

browser:
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
	  (echo "installing Debian chromium for the browser tests"; \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	   || echo "could not install chromium: the browser tests will skip")

test: venv browser $(PLOTLY_BUNDLE)
	$(BIN)/ruff check seqis app tests scripts
	$(BIN)/lint-imports
	SEQIS_HYPOTHESIS=full $(BIN)/python -m pytest -q -m ""

run: venv $(PLOTLY_BUNDLE)
	$(BIN)/python -m app --server.port $(PORT) --server.address $(ADDRESS) --browser.gatherUsageStats false

bench: venv $(PLOTLY_BUNDLE)
	$(BIN)/python -m seqis.bench

lint: venv
	$(BIN)/ruff check seqis app tests scripts

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
