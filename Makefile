# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
# The suite mostly waits on brokers, group joins and backoffs, so two pytest-xdist workers share two cores well
# (TEST_WORKERS=0: one process). Each takes a whole file at a time, the Spark files as one (tests/conftest.py).
TEST_WORKERS ?= 2

.PHONY: setup receiver test demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

setup: $(STAMP) receiver

# The Java receiver plugin, its sandbox host and the Java test clients (build/receiver/); fast when up to date.
receiver: $(STAMP)
	$(PY) receiver/build.py

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The demo also runs without a JDK (the Python receiver, librdkafka clients only): Java is built when javac is here.
demo: $(STAMP)
	@if command -v javac >/dev/null && command -v jar >/dev/null; then $(PY) receiver/build.py; \
	else echo "make demo: no JDK (javac and jar): running without the Java receiver and Java clients"; fi
	$(VENV)/bin/kcm demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
