# make demo: install, then the whole pipeline (data -> SFT -> DAPO -> held-out eval), a long run of a
#   few minutes (docs/results.md, "The demo"); DEMO_ARGS go to both scripts, e.g. "--seed=2"
# make test: install the test requirements, run the suite
# make compare: every RL algorithm and two baselines side by side from make demo's SFT checkpoint
#   (27 runs, 2 at a time)
PYTHON ?= python
PIP ?= $(PYTHON) -m pip
DEMO_ARGS ?=

.PHONY: demo test compare install install-test
install:
	$(PIP) install -q -r requirements.txt
install-test:
	$(PIP) install -q -r requirements-test.txt
demo: install
	$(PYTHON) -m data.tasks --task=mul
	$(PYTHON) sft.py configs/mul.py $(DEMO_ARGS)
	$(PYTHON) rl.py --loss=dapo --max_iters=500 --eval_interval=100 $(DEMO_ARGS)
	@echo "make demo: success is a held-out gain of +10 points or more on the line above (RL over SFT)"
test: install-test
	$(PYTHON) -m pytest
compare: install
	$(PYTHON) bench/compare.py
