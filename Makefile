# make demo: install, then the whole pipeline (data -> SFT -> RL -> held-out eval): ~3.5 min on 2 Intel cores with bf16 (AMX), ~29 min on 2 cores without bf16 (fp32)
# make test: install the test requirements, run the suite (~4 min on 2 CPU cores)
# make compare: every RL algorithm and two baselines side by side from the SFT checkpoint (27 runs, 2 at a time; needs make demo's SFT)
PYTHON ?= python
PIP ?= $(PYTHON) -m pip

.PHONY: demo test compare install install-test
install:
	$(PIP) install -q -r requirements.txt
install-test:
	$(PIP) install -q -r requirements-test.txt
demo: install
	$(PYTHON) -m data.tasks --task=mul
	$(PYTHON) sft.py configs/mul.py
	$(PYTHON) sample.py --ckpt=out/sft-mul/ckpt.pt --prompts_file=data/mul/test.txt > out/sft-mul/test_samples.txt
	$(PYTHON) rl.py --loss=grpo
test: install-test
	$(PYTHON) -m pytest
compare: install
	$(PYTHON) bench/compare.py
