# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

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
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/kcm demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
