# zps - synchronous data-parallel training on a sharded parameter server.
#
#   make            build bin/zps-server, bin/zps-worker, bin/zps-ctl
#   make demo       install missing Debian packages, build, train Fashion-MNIST on loopback
#   make test       install missing Debian packages, build, run unit, integration and deploy tests
#                   (the short tier, minutes; docs/tests.md)
#   make test-long  the long cases: ten churn runs, the chaos schedule, straggler timing,
#                   the adaptive split, 600 workers and the 4096-member swarm, the long
#                   Python tests, zps.sbatch requeued under a real one-node Slurm (CI runs
#                   both tiers)
#   make install    libzps (header, .a, .so.1, zps.pc) under PREFIX (default /usr/local)
#   make bench      ms/step of the default job with 1 and 2 workers (bench/train.sh)
#   make bench-all  every case of the performance table beside its peers, with ratios and
#                   targets (bench/all.sh; BENCH_ARGS="--quick --md FILE", --help)
#   make bench-accum  a deterministic shard's canonical tree against exact accumulators
#                   (bench/accum.c, docs/choices.md; ACCUM_ARGS="P REPS")
#   make bench-swarm  the control plane's CPU per member and step, N libzps clients against
#                   real servers (bench/swarm.c; SWARM_ARGS="--members 64,256,1024,4096")
#   make soak       the chaos test for 10 minutes (SOAK_SECONDS=, SEED=)
#
# Checks (CI runs them after make test; their extra packages come from
# deploy/install-deps.sh --ci):
#   make test SAN=1 the same tests, everything built with ASan + UBSan into build/san/
#   make valgrind   one short training run (1 server, 2 workers) under valgrind memcheck
#   make lint       cppcheck and clang-tidy (.clang-tidy) over common/ server/ lib/ worker/ ctl/
#                   fuzz/ and bench/bare_ps.c
#   make fuzz       libFuzzer over the server's message path for FUZZ_SECONDS (default 30)
#
# Dependencies come from pkg-config; deploy/install-deps.sh installs them.
#
# The CUDA worker backend (--device cuda[:N]) is a plugin, $(BIN)/libzps_cuda.so,
# built from worker/zps_cuda.cu when nvcc is found:
#   CUDA=auto       (default) build it if $(CUDA_HOME)/bin/nvcc or nvcc on PATH exists
#   CUDA=1          build it; no nvcc is an error
#   CUDA=0          never build it; --device cuda then says so in one line
#   CUDA_HOME=DIR   the toolkit (default /usr/local/cuda, or nvcc's parent on PATH)
#   CUDA_ARCH=...   nvcc -gencode flags (default: sm_80, sm_90 and PTX for newer cards)

# ---------------------------------------------------------------- build flavour
# SAN=1 builds every object, library, binary and test with AddressSanitizer
# and UndefinedBehaviorSanitizer into their own directory (build/san, its
# binaries in build/san/bin), so a sanitized object never ends up in a normal
# binary or the reverse. -O1 keeps the stack traces readable and the
# sanitized build quick to compile.
ifeq ($(SAN),1)
B := build/san
BIN := build/san/bin
OPT ?= -O1
SAN_CFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
B := build
BIN := bin
SAN_CFLAGS :=
endif

OPT ?= -O3
PKGS := libzmq libprotobuf-c openblas zlib libzstd libxxhash libmicrohttpd jansson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

ZPS_CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -MMD -MP $(SAN_CFLAGS) \
	-I. -I$(B) $(PKG_CFLAGS) $(CFLAGS)
ZPS_LDLIBS := $(PKG_LIBS) -lm -pthread -ldl $(LDLIBS)

# ---------------------------------------------------------------- CUDA
# The plugin is loaded with dlopen only when a worker asks for a GPU, so
# zps-worker itself never links CUDA: CPU jobs need no driver, and valgrind
# and the sanitizers see no CUDA library in them. nvcc objects are never
# sanitized (SAN=1 builds the same plugin into build/san/bin); host code is
# compiled with -Wall -Wextra -Werror like the rest.
CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC := $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifneq ($(NVCC),)
ifeq ($(wildcard $(CUDA_HOME)/include/cublas_v2.h),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
endif
endif
ifeq ($(CUDA),0)
HAVE_CUDA := 0
else ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1: no nvcc in $(CUDA_HOME)/bin or on PATH; set CUDA_HOME to the CUDA toolkit, or build with CUDA=0)
endif
HAVE_CUDA := 1
else ifeq ($(CUDA),auto)
HAVE_CUDA := $(if $(NVCC),1,0)
else
$(error CUDA=$(CUDA): expected auto, 0 or 1)
endif
ifeq ($(MAKELEVEL),0)
ifeq ($(HAVE_CUDA),1)
$(info CUDA backend: on ($(NVCC)))
else
$(info CUDA backend: off ($(if $(filter 0,$(CUDA)),CUDA=0,no nvcc in $(CUDA_HOME)/bin or on PATH)); --device cuda will say so)
endif
endif
# CUDA 13 supports sm_75 and newer; sm_80 (A100) and sm_90 (H100/H200) get
# native code, and compute_90 PTX lets newer cards JIT it.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -std=c++17 -O3 -g -lineinfo $(CUDA_ARCH) -I. -MMD -MP \
	-Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror $(NVCCFLAGS)
CUDA_PLUGIN := $(BIN)/libzps_cuda.so
ifeq ($(HAVE_CUDA),1)
CUDA_TARGETS := $(CUDA_PLUGIN)
else
CUDA_TARGETS :=
endif

PROTO_C := $(B)/proto/zps.pb-c.c
COMMON_SRC := $(PROTO_C) $(wildcard common/*.c)
# server/: the loop at the top, one folder a concept below it (coord/, shard/).
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c server/*/*.c))
# One folder a product: lib/ is libzps, worker/ the zps-worker program on it.
LIB_SRC := $(wildcard lib/*.c)
WORKER_SRC := $(filter-out worker/main.c,$(wildcard worker/*.c))
# The unit suites mirror the sources (tests/lib/zps_min.c is test-install's
# program); tests/zps_tmpdir.c is their shared scratch-directory fixture,
# tests/server/shard/zps_shard_fx.c the shard suites' job.
UNIT_SRC := tests/check_unit.c tests/zps_tmpdir.c tests/server/shard/zps_shard_fx.c \
	$(wildcard $(addsuffix /check_*.c,tests/common tests/server tests/lib tests/worker))
# The server's tests mirror its folders too (tests/server/coord, tests/server/shard).
UNIT_SRC += $(wildcard tests/server/*/check_*.c)
INTEG_SRC := $(wildcard tests/integration/*.c)

obj = $(patsubst %.c,$(B)/obj/%.o,$(patsubst $(B)/%,%,$(1)))
COMMON_OBJ := $(call obj,$(COMMON_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
WORKER_OBJ := $(call obj,$(WORKER_SRC))

# libzps (include/zps.h): lib/ and what it needs of common/, as an
# archive and as a shared library with a versioned soname whose exports are
# the public API alone (lib/libzps.map). zps-worker (worker/) links the
# archive; its training loop and backends (the "user code") are not in the
# library.
LIBZPS_SRC := $(PROTO_C) $(addprefix common/,zps_atomic.c zps_ckpt.c zps_curve.c zps_dtype.c zps_err.c zps_groups.c zps_layout.c \
	zps_log.c zps_model.c zps_optim.c zps_outer.c zps_plan.c zps_plans.c zps_quant.c zps_shm.c \
	zps_sndbuf.c zps_timers.c zps_tree.c zps_wire.c zps_wirecode.c zps_zcode.c) $(LIB_SRC)
LIBZPS_OBJ := $(call obj,$(LIBZPS_SRC))
LIBZPS_PIC := $(patsubst $(B)/obj/%,$(B)/pic/%,$(LIBZPS_OBJ))
ZPS_SO_MAJOR := 1
ZPS_SO_VERSION := 1.6.0
LIBZPS_SO := $(BIN)/libzps.so.$(ZPS_SO_VERSION)
LIBZPS_LIBS := $(shell pkg-config --libs libzmq libprotobuf-c zlib libzstd libxxhash 2>/dev/null) -lm -pthread
ZPS_WORKER_OBJ := $(call obj,worker/main.c $(WORKER_SRC))

BINS := $(BIN)/zps-server $(BIN)/zps-worker $(BIN)/zps-ctl
EXAMPLES := $(BIN)/tanh_mlp
TESTS := $(B)/tests/check_unit $(B)/tests/check_integration

.PHONY: all deps test-deps demo test test-unit test-integration test-fuzz-replay test-deploy bench clean
all: $(BINS) $(CUDA_TARGETS) $(B)/libzps.a $(LIBZPS_SO) $(EXAMPLES)

# zps_backend.c looks for the plugin only in a CUDA build; the stamp
# rebuilds it when CUDA= changes between two makes.
CUDA_STAMP := $(B)/cuda-$(HAVE_CUDA).stamp
$(CUDA_STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/cuda-*.stamp
	@touch $@
$(B)/obj/worker/zps_backend.o: $(CUDA_STAMP)
ifeq ($(HAVE_CUDA),1)
$(B)/obj/worker/zps_backend.o: ZPS_CFLAGS += -DZPS_HAVE_CUDA \
	-DZPS_CUDA_PLUGIN_PATH='"$(CURDIR)/$(CUDA_PLUGIN)"'
endif

$(B)/obj/worker/zps_cuda.o: worker/zps_cuda.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@
# cudart linked shared like cuBLAS (one runtime in the process), both found
# through the rpath wherever the toolkit was at build time.
$(CUDA_PLUGIN): $(B)/obj/worker/zps_cuda.o
	@mkdir -p $(BIN)
	$(NVCC) -shared $(CUDA_ARCH) --cudart shared -o $@ $^ -L$(CUDA_HOME)/lib64 -lcublas \
		-Xlinker -rpath,$(CUDA_HOME)/lib64

deps:
	@bash deploy/install-deps.sh

test-deps:
	@bash deploy/install-deps.sh --test

# Both files of one protoc-c run: the header named as made here too, so
# that an object whose dependency file lists it is rebuilt in the same run
# that regenerates it (not the run after, against a stale struct layout).
$(PROTO_C) $(B)/proto/zps.pb-c.h &: proto/zps.proto
	@mkdir -p $(B)
	protoc-c --proto_path=. --c_out=$(B) $<

# Every object may include the generated header.
$(B)/obj/%.o: %.c | $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@
$(B)/obj/proto/%.o: $(B)/proto/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@
# Position-independent twins of libzps's objects, for the shared library.
$(B)/pic/%.o: %.c | $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -fPIC -c $< -o $@
$(B)/pic/proto/%.o: $(B)/proto/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -fPIC -c $< -o $@

# Adam takes a square root per element; its argument is never negative, so
# there is no errno to set, and without that call the loop vectorizes (the
# same bits: sqrtps rounds as sqrtss does), twice as fast.
$(B)/obj/common/zps_optim.o: ZPS_CFLAGS += -fno-math-errno

$(B)/libzps_common.a: $(COMMON_OBJ)
$(B)/libzps_server.a: $(SERVER_OBJ)
$(B)/libzps_worker.a: $(WORKER_OBJ)
$(B)/libzps.a: $(LIBZPS_OBJ)
$(B)/%.a:
	@rm -f $@
	ar rcs $@ $^

# The examples (examples/) know the public header alone: -Iinclude, not -I.
$(BIN)/tanh_mlp: examples/tanh_mlp.c include/zps.h $(B)/libzps.a
	@mkdir -p $(BIN)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror $(SAN_CFLAGS) -Iinclude \
		$(shell pkg-config --cflags openblas) $(CFLAGS) -o $@ $< $(B)/libzps.a \
		$(LIBZPS_LIBS) $(shell pkg-config --libs openblas) -lm $(LDLIBS)

$(BIN)/zps-server: $(B)/obj/server/main.o $(B)/libzps_server.a $(B)/libzps_common.a
$(BIN)/zps-worker: $(ZPS_WORKER_OBJ) $(B)/libzps.a $(B)/libzps_common.a

# libzps.so.$(ZPS_SO_VERSION) (1.1: ZPS_OPT_SHM; 1.2: diloco; 1.3: a diloco job's inner
# optimizer, node ZPS_1.3 of the map; 1.4: declared parameter groups, buffers, a
# learning-rate table and clipping, node ZPS_1.4; 1.5: a job's checkpoints read
# back, zps_checkpoint_*, node ZPS_1.5; 1.6: a deterministic job, zps_push_micro,
# node ZPS_1.6), soname libzps.so.1, and the links a
# build and a loader look for.
$(LIBZPS_SO): $(LIBZPS_PIC) lib/libzps.map
	@mkdir -p $(BIN)
	$(CC) $(ZPS_CFLAGS) -shared -Wl,-soname,libzps.so.$(ZPS_SO_MAJOR) \
		-Wl,--version-script=lib/libzps.map -Wl,--no-undefined -o $@ $(LIBZPS_PIC) \
		$(LIBZPS_LIBS) $(LDLIBS)
	ln -sf libzps.so.$(ZPS_SO_VERSION) $(BIN)/libzps.so.$(ZPS_SO_MAJOR)
	ln -sf libzps.so.$(ZPS_SO_MAJOR) $(BIN)/libzps.so
$(BIN)/zps-ctl: $(B)/obj/ctl/zps_ctl.o $(B)/obj/ctl/zps_report.o $(B)/libzps_common.a
$(BIN)/zps-ctl: ZPS_LDLIBS += $(shell pkg-config --libs jansson 2>/dev/null)
$(BIN)/%:
	@mkdir -p $(BIN)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(ZPS_LDLIBS)

CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
$(B)/tests/check_unit: $(call obj,$(UNIT_SRC)) $(B)/libzps_server.a $(B)/libzps_worker.a \
		$(B)/libzps.a $(B)/libzps_common.a | $(CUDA_TARGETS)
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(ZPS_LDLIBS)
$(B)/tests/check_integration: $(call obj,$(INTEG_SRC)) $(B)/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(shell pkg-config --libs expat 2>/dev/null) $(ZPS_LDLIBS)

demo: deps
	@$(MAKE) --no-print-directory all
	@bash deploy/demo.sh

# The build of make test and make test-long uses every core (a newcomer
# types plain make test). Then three at a time (-O prints each one's output
# whole): the integration tests, the Python tests (its two groups one after
# the other) and the unit suites, the deploy checks once the unit suites are
# done. They start jobs of real processes that wait on each other far more
# than they compute, no test bounds a time by the machine's speed, and each
# has its own ports, processes and directory: in two phases (the unit and
# deploy checks, then the others) they kept 1.5 of the 2 cores busy (327 s
# on an AMD EPYC); in one, 278 s. Under SAN=1, which leaves out the deploy
# and Python tests, the unit suites run beside the integration tests
# (sanitized, 170 and 345 s of one core measured).
NPROC := $(shell nproc 2>/dev/null || echo 1)
test: test-deps
	@$(MAKE) --no-print-directory -j$(NPROC) all $(TESTS) $(FUZZ_REPLAY)
	@$(MAKE) --no-print-directory -j3 -O test-integration test-python test-unit-etc \
		test-deploy PY_JOBS=1

# The unit suites, the fuzz replay and the install test: no job of processes.
test-unit-etc:
	@$(MAKE) --no-print-directory test-unit test-fuzz-replay test-install

# A unit case's bound is Check's default of 4 s unless its case sets one:
# 60 s, so that a case asserts what it computes, not how fast the shared
# cores are (one of the quantizer's ran past 4 s while builds shared them).
test-unit: $(B)/tests/check_unit
	CK_DEFAULT_TIMEOUT=60 $(B)/tests/check_unit

# The integration tests start the binaries of this flavour (ZPS_BIN_DIR).
# Two tiers (docs/tests.md): make test runs every suite in its short form,
# leaving out the cases tagged "long" (minutes each: the ten churn runs in
# a row, the seeded chaos schedule, the straggler detector's timing and the
# adaptive split) and "soak" (make soak), and says so; make test-long runs
# the long ones. Under SAN=1 only the short tier runs. After a pass each
# prints the time by suite and the slowest cases (Check's XML log, read by
# tests/integration/durations.py): what to look at when a tier grows.
test-integration: $(B)/tests/check_integration $(BINS) $(CUDA_TARGETS)
	@echo "SKIPPED here: the integration cases tagged long (make test-long runs them)"
	CK_EXCLUDE_TAGS="long soak" ZPS_BIN_DIR=$(CURDIR)/$(BIN) \
		CK_XML_LOG_FILE_NAME=$(B)/tests/integration.xml $(B)/tests/check_integration
	@$(PYTHON) tests/integration/durations.py $(B)/tests/integration.xml

.PHONY: test-long test-long-deps test-integration-long test-integration-long-timed \
	test-integration-long-compute test-integration-long-compute1 \
	test-integration-long-compute2 test-integration-long-compute3 test-python-long \
	test-deploy-long
test-long: test-long-deps
	@$(MAKE) --no-print-directory -j$(NPROC) all $(B)/tests/check_integration
	@$(MAKE) --no-print-directory test-integration-long-timed
	@$(MAKE) --no-print-directory -j3 -O test-integration-long-compute1 \
		test-integration-long-compute2 test-integration-long-compute3 \
		test-deploy-long test-python-long

# make test's packages and Slurm's (slurm-wlm, munge), which only
# test-deploy-long uses.
test-long-deps:
	@bash deploy/install-deps.sh --long

# The long cases in two phases. First, alone, those that measure when
# something happens (the straggler detector, the adaptive split, the host's
# timers) or take the machine (the swarm). Then those tagged `compute` (the
# churn ten times, the chaos schedule, the deterministic runs over two
# epochs), which assert no time, only that jobs end and their bits agree,
# each in a process of its own, three at a time with the Slurm test (which
# waits far more than it computes: 5 s of CPU in its minute) and the Python
# tests marked long: one after the other they kept 1.2 of the 2 cores busy
# (413 s; about 480 s of CPU); side by side they took 272 s. A case tagged
# compute runs in test-integration-long-compute1 unless it also names lane2
# or lane3.
# The swarm suite's 4096 members are bench/swarm's (ZPS_SWARM).
LONG_ENV = ZPS_BIN_DIR=$(CURDIR)/$(BIN) ZPS_SWARM=$(CURDIR)/build/bench/swarm
LONG_TAGS_timed = CK_INCLUDE_TAGS=long CK_EXCLUDE_TAGS="compute soak"
LONG_TAGS_compute1 = CK_INCLUDE_TAGS=compute CK_EXCLUDE_TAGS="lane2 lane3"
LONG_TAGS_compute2 = CK_INCLUDE_TAGS=lane2
LONG_TAGS_compute3 = CK_INCLUDE_TAGS=lane3
LONG_LANES = test-integration-long-compute1 test-integration-long-compute2 \
	test-integration-long-compute3
test-integration-long: test-integration-long-timed test-integration-long-compute
test-integration-long-compute: $(LONG_LANES)
test-integration-long-timed: build/bench/swarm
test-integration-long-timed $(LONG_LANES): test-integration-long-%: \
		$(B)/tests/check_integration $(BINS) $(CUDA_TARGETS)
ifeq ($(SAN),1)
	$(error make test-long runs the normal build; drop SAN=1)
endif
	$(LONG_TAGS_$*) $(LONG_ENV) \
		CK_XML_LOG_FILE_NAME=$(B)/tests/integration-long-$*.xml $(B)/tests/check_integration
	@$(PYTHON) tests/integration/durations.py $(B)/tests/integration-long-$*.xml

# The Python package (python/zps) with Debian's python3-torch, which only
# Debian's own interpreter sees (not a python3 of pyenv or a venv earlier on
# PATH). Under SAN=1 libzps is built with ASan, which a Python process cannot
# load without preloading the sanitizer runtime: skipped, and said so.
PYTHON ?= /usr/bin/python3
.PHONY: test-python test-python-recipes test-python-rest test-unit-etc
PYTEST = ZPS_BIN_DIR=$(CURDIR)/$(BIN) ZPS_LIB=$(CURDIR)/$(BIN)/libzps.so.$(ZPS_SO_MAJOR) \
	PYTHONPATH=$(CURDIR)/python $(PYTHON) -m pytest -v -rs -p no:cacheprovider --durations=5
# zps.torch's own tests in one pytest and the others in another, side by side
# (-O: each one's output whole): the jobs they start wait on each other
# more than they compute, and each test has its own processes, ports and
# directory. make test runs them one after the other (PY_JOBS=1), beside
# the integration tests.
PY_JOBS ?= 2
PY_RECIPES := tests/python/test_torch_recipes.py tests/python/test_torch_optim.py \
	tests/python/test_torch.py
test-python: $(BINS) $(LIBZPS_SO)
ifeq ($(SAN),1)
	@echo "SKIPPED: test-python under SAN=1 (an ASan libzps does not load into python3); make test runs it"
else
	@$(MAKE) --no-print-directory -j$(PY_JOBS) -O test-python-recipes test-python-rest
endif
test-python-recipes: $(BINS) $(LIBZPS_SO)
	$(PYTEST) -m "not long" $(PY_RECIPES)
test-python-rest: $(BINS) $(LIBZPS_SO)
	$(PYTEST) -m "not long" $(addprefix --ignore=,$(PY_RECIPES)) tests/python

# The Python tests marked long (tests/python/conftest.py): make test-long.
test-python-long: $(BINS) $(LIBZPS_SO)
	$(PYTEST) -m long tests/python

# The fuzz target run once over its generated seeds and over every input
# that once broke it (fuzz/regressions/): a regression test with this
# flavour's compiler and sanitizers, no clang needed.
FUZZ_REPLAY := $(B)/fuzz/zps_fuzz_replay $(B)/fuzz/zps_fuzz_seeds
$(B)/fuzz/zps_fuzz_replay: $(B)/obj/fuzz/zps_fuzz_replay.o $(B)/obj/fuzz/zps_fuzz_msg.o \
		$(B)/libzps_server.a $(B)/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(ZPS_LDLIBS)
$(B)/fuzz/zps_fuzz_seeds: $(B)/obj/fuzz/zps_fuzz_seeds.o $(B)/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(ZPS_LDLIBS)

test-fuzz-replay: $(FUZZ_REPLAY)
	@rm -rf $(B)/fuzz/seeds && mkdir -p $(B)/fuzz/seeds
	$(B)/fuzz/zps_fuzz_seeds $(B)/fuzz/seeds
	$(B)/fuzz/zps_fuzz_replay $(B)/fuzz/seeds fuzz/regressions

# The launchers of deploy/ (tests/deploy/run.sh): shellcheck, the systemd
# units (systemd-analyze), the Slurm script (dry runs and a real run on
# loopback), the Kubernetes manifests (their API schema, with npm packages
# pinned in tests/deploy/node) and the Dockerfiles (a linter). V=1 shows
# the checks of passing tests too.
# Not under SAN=1: the launchers, flag tables and docs run bin/ of the
# tree, the same binaries make test ran them with.
test-deploy: $(BINS)
ifeq ($(SAN),1)
	@echo "SKIPPED: test-deploy under SAN=1 (it checks deploy/ and docs/ with bin/, as make test does)"
else
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) bash tests/deploy/run.sh
endif

# The long deploy tests (tests/deploy/long_*.sh): zps.sbatch under a real
# one-node Slurm (munged, slurmctld, slurmd started as root in a temporary
# directory), requeued past a checkpoint; skipped, and said so, when not
# root or without the packages.
test-deploy-long: $(BINS)
ifeq ($(SAN),1)
	$(error make test-long runs the normal build; drop SAN=1)
endif
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) bash tests/deploy/run.sh --long

# The flag tables of docs/running.md, rewritten from the daemons' own (--flags-markdown);
# test-deploy's readme_flags fails while they differ.
.PHONY: readme-flags
readme-flags: $(BINS)
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) bash tests/deploy/test_readme_flags.sh --write

bench: all
	@bash bench/train.sh

# The peers bench/ holds zps against: the raw ZeroMQ ceiling (bench/comm)
# and the bare parameter server (bench/all.sh). Plain C over libzmq, no
# zps code; never sanitized (they are measured, not tested).
BENCH_BINS := build/bench/zmq_ceiling build/bench/bare_ps build/bench/accum build/bench/swarm
build/bench/%: bench/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O3 -g -Wall -Wextra -Werror $(shell pkg-config --cflags libzmq) \
		$(CFLAGS) -o $@ $< $(shell pkg-config --libs libzmq) $(LDLIBS)

.PHONY: bench-all
BENCH_ARGS ?=
bench-all: all $(BENCH_BINS)
	@bash bench/all.sh $(BENCH_ARGS)

# The swarm (bench/swarm.c) is a client of libzps, the public header alone,
# as the examples are.
build/bench/swarm: bench/swarm.c include/zps.h $(B)/libzps.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Iinclude $(CFLAGS) -o $@ $< \
		$(B)/libzps.a $(LIBZPS_LIBS) $(LDLIBS)

# The control plane's cost per member: N libzps clients, many to a process,
# against real servers (bench/swarm.c; SWARM_ARGS="--members 64,256 --shards 2").
.PHONY: bench-swarm
SWARM_ARGS ?=
bench-swarm: all build/bench/swarm
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) build/bench/swarm $(SWARM_ARGS)

# What a deterministic job's sum of micro-batches costs on a shard: the
# canonical tree against exact accumulators (bench/accum.c, docs/choices.md).
.PHONY: bench-accum
bench-accum: build/bench/accum
	build/bench/accum $(ACCUM_ARGS)

# libzps for programs of others: make install PREFIX=DIR (default /usr/local;
# DESTDIR= for packaging) puts the header, the archive, the shared library
# with its soname links and zps.pc under it.
PREFIX ?= /usr/local
.PHONY: install test-install
install: $(B)/libzps.a $(LIBZPS_SO) $(BINS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 include/zps.h $(DESTDIR)$(PREFIX)/include/zps.h
	install -m 644 $(B)/libzps.a $(DESTDIR)$(PREFIX)/lib/libzps.a
	install -m 755 $(LIBZPS_SO) $(DESTDIR)$(PREFIX)/lib/libzps.so.$(ZPS_SO_VERSION)
	ln -sf libzps.so.$(ZPS_SO_VERSION) $(DESTDIR)$(PREFIX)/lib/libzps.so.$(ZPS_SO_MAJOR)
	ln -sf libzps.so.$(ZPS_SO_MAJOR) $(DESTDIR)$(PREFIX)/lib/libzps.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(ZPS_SO_VERSION)|' lib/zps.pc.in \
		>$(DESTDIR)$(PREFIX)/lib/pkgconfig/zps.pc

# A program built against the installed header and zps.pc only joins a job
# and trains (tests/lib/install.sh).
# Under SAN=1 the program is built with the same sanitizers as the library.
test-install: $(BINS) $(B)/libzps.a $(LIBZPS_SO)
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) ZPS_TEST_CFLAGS="$(SAN_CFLAGS)" \
		ZPS_INSTALL_MAKEFLAGS="$(if $(filter 1,$(SAN)),SAN=1)" bash tests/lib/install.sh

# The chaos test for SOAK_SECONDS (default 600) of events, before a release:
# workers killed and replaced, paused, shard 1 and the coordinator killed
# and resumed, on the schedule of SEED (default 1), in a deterministic job
# whose survivors must end bitwise equal to an undisturbed run of as many
# steps (run first, a few minutes more). make soak SEED=7.
SOAK_SECONDS ?= 600
SEED ?= 1
.PHONY: soak
soak: all $(B)/tests/check_integration
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) ZPS_SOAK_SECONDS=$(SOAK_SECONDS) ZPS_CHAOS_SEED=$(SEED) \
		CK_RUN_SUITE=chaos CK_RUN_CASE=soak $(B)/tests/check_integration

# ================================================================ checks
# What CI runs after make test (.ci/run). Their extra packages (clang,
# clang-tidy, cppcheck, valgrind) come from deploy/install-deps.sh --ci;
# make demo and make test never need them.

# ---------------------------------------------------------------- SAN=1
# Runtime options of the sanitized tests: a finding aborts the process
# (Check reports the signal; a server or worker exits non-zero, which the
# integration tests see), leaks are checked at every exit, and Check's
# timeouts stretch for the slower sanitized code. Suppressions of reports
# inside libraries we do not build live in tests/sanitizers/.
ifeq ($(SAN),1)
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1:abort_on_error=1
export LSAN_OPTIONS ?= suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0
export CK_TIMEOUT_MULTIPLIER ?= 2
endif

# ---------------------------------------------------------------- valgrind
# One short training run, 1 server + 2 workers, every process under
# memcheck (tests/valgrind/train.sh): fails on any invalid access or
# definite leak. The normal build: valgrind cannot run ASan binaries.
.PHONY: valgrind
valgrind: all
ifeq ($(SAN),1)
	$(error make valgrind runs the normal build; drop SAN=1)
endif
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) bash tests/valgrind/train.sh
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) ZPS_VALGRIND_INNER_STEPS=5 bash tests/valgrind/train.sh

# ---------------------------------------------------------------- lint
# cppcheck over the sources as one project, then clang-tidy (.clang-tidy)
# once per file: one clang-tidy process over several files reports
# va_list false positives from state left by the previous file. -k and
# output per file: every finding of every file is shown, not the first.
# server/, lib/ and worker/ each have a .clang-tidy of their own over the
# project's, bounding a function's body at 60 lines (readability-function-
# size). worker/zps_cuda.cu is not linted: clang-tidy 14 knows CUDA up to
# 11.5, and without the toolkit's headers the kernels' builtins are
# undeclared; its functions are held under the same bound by hand.
LINT_DIRS := common server lib worker ctl fuzz
# Of bench/, the bare parameter server, the accumulators' benchmark and the
# swarm (bench/zmq_ceiling.c is older and not yet clean under these checks).
LINT_BENCH := bench/bare_ps.c bench/accum.c bench/swarm.c
# server/ has a folder a concept (coord/, shard/): their files too.
LINT_SRC := $(wildcard $(addsuffix /*.c,$(LINT_DIRS)) server/*/*.c) $(LINT_BENCH)
LINT_PROTO := build/lint/proto/zps.pb-c.c
TIDY_FLAGS := -std=c11 -D_GNU_SOURCE -I. -Ibuild/lint $(PKG_CFLAGS)
CPPCHECK_FLAGS := --quiet --error-exitcode=1 --inline-suppr --std=c11 --library=posix \
	--enable=warning,style,performance,portability -D_GNU_SOURCE -I. -j2 \
	-D__ORDER_LITTLE_ENDIAN__=1234 -D__ORDER_BIG_ENDIAN__=4321 -D__BYTE_ORDER__=1234 \
	--suppress=knownConditionTrueFalse --suppress=readdirCalled
TIDY_TARGETS := $(addprefix lint-tidy/,$(LINT_SRC))
# The dispatcher is linted with its plugin loader in, built or not: the
# loader is the larger branch, and zps_cuda.h needs no CUDA header.
lint-tidy/worker/zps_backend.c: TIDY_FLAGS += -DZPS_HAVE_CUDA -DZPS_CUDA_PLUGIN_PATH='"/lint"'
# The swarm knows the public header alone, as it is built.
lint-tidy/bench/swarm.c: TIDY_FLAGS += -Iinclude

.PHONY: lint lint-cppcheck lint-tidy $(TIDY_TARGETS)

lint:
	@$(MAKE) --no-print-directory -k lint-cppcheck lint-tidy

$(LINT_PROTO): proto/zps.proto
	@mkdir -p build/lint
	protoc-c --proto_path=. --c_out=build/lint $<

# cppcheck without the generated header (it would need protobuf-c's system
# header to pass its version check); the project's own headers are read.
# It knows none of the compiler's predefined macros: the byte-order checks
# (#error on big-endian hosts) need GCC's three. Two checks are off:
#   knownConditionTrueFalse  cppcheck 2.10's value flow takes every chunked
#     loop, `n = len > C ? C : len; for (i = 0; i < n; i++)`, for a loop that
#     never runs: only false positives here, and the pattern is everywhere.
#   readdirCalled  it recommends readdir_r, which glibc deprecates; readdir
#     is safe on a stream no other thread reads.
lint-cppcheck:
	@command -v cppcheck >/dev/null || { echo "lint: no cppcheck (HINT: deploy/install-deps.sh --ci)"; exit 1; }
	cppcheck $(CPPCHECK_FLAGS) $(LINT_DIRS) $(LINT_BENCH)

NPROC := $(shell nproc 2>/dev/null || echo 2)
lint-tidy: $(LINT_PROTO)
	@command -v clang-tidy >/dev/null || { echo "lint: no clang-tidy (HINT: deploy/install-deps.sh --ci)"; exit 1; }
	@echo "clang-tidy $(words $(LINT_SRC)) files of $(LINT_DIRS)"
	@$(MAKE) --no-print-directory -k -j$(NPROC) -Otarget $(TIDY_TARGETS)

# The count line clang-tidy prints to stderr says nothing; the findings
# (stdout) and the exit status are kept.
$(TIDY_TARGETS): lint-tidy/%: | $(LINT_PROTO)
	@out=$$(clang-tidy --quiet $* -- $(TIDY_FLAGS) 2>&1); rc=$$?; \
	printf '%s\n' "$$out" | grep -v -E '^[0-9]+ (warning|error)s? (and [0-9]+ (warning|error)s? )?generated\.$$|^$$'; \
	exit $$rc

# ---------------------------------------------------------------- fuzz
# make fuzz FUZZ_SECONDS=N: libFuzzer (clang) over the message path of a
# real server on inproc sockets (fuzz/zps_fuzz_msg.c: its receive path,
# message table and handlers), starting from generated seeds, the inputs it
# found before (build/fuzz/corpus) and the regressions (fuzz/regressions).
# A finding fails the run; its input is in build/fuzz/artifacts/ and
# belongs in fuzz/regressions/, which make test replays.
FUZZ_SECONDS ?= 30
FUZZ_CC ?= clang
FZ := build/fuzz
# No -Werror: gcc's warnings gate the build; a warning only clang gives
# must not stop the fuzzing (make lint runs clang's analysis anyway).
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined -MMD -MP \
	-I. -I$(FZ) $(PKG_CFLAGS)
# The target links the server (zps_server_open, zps_server_turn) and what
# it needs from one archive of common/ and server/, as zps-server does.
FUZZ_LIB_SRC := $(FZ)/proto/zps.pb-c.c $(COMMON_SRC:$(PROTO_C)=) $(SERVER_SRC)
FUZZ_LIB_OBJ := $(patsubst %.c,$(FZ)/obj/%.o,$(patsubst $(FZ)/%,%,$(FUZZ_LIB_SRC)))
.PHONY: fuzz

$(FZ)/proto/zps.pb-c.c: proto/zps.proto
	@mkdir -p $(FZ)
	protoc-c --proto_path=. --c_out=$(FZ) $<
# Coverage-instrumented objects (fuzzer-no-link); libFuzzer's main comes
# in at the link.
$(FZ)/obj/%.o: %.c | $(FZ)/proto/zps.pb-c.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FZ)/obj/proto/%.o: $(FZ)/proto/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FZ)/libzps_fuzz.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(FZ)/zps_fuzz_msg: $(FZ)/obj/fuzz/zps_fuzz_msg.o $(FZ)/libzps_fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ $(ZPS_LDLIBS)

fuzz: deps
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: no $(FUZZ_CC) (HINT: deploy/install-deps.sh --ci)"; exit 1; }
	@$(MAKE) --no-print-directory -j$(NPROC) $(FZ)/zps_fuzz_msg $(B)/fuzz/zps_fuzz_seeds
	@rm -rf $(FZ)/seeds && mkdir -p $(FZ)/seeds $(FZ)/corpus $(FZ)/artifacts
	$(B)/fuzz/zps_fuzz_seeds $(FZ)/seeds
	$(FZ)/zps_fuzz_msg -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 \
		-print_final_stats=1 -artifact_prefix=$(FZ)/artifacts/ \
		$(FZ)/corpus $(FZ)/seeds fuzz/regressions || \
	{ echo "fuzz: FINDING; its input is in $(FZ)/artifacts/: add it to fuzz/regressions/" >&2; exit 1; }

clean:
	rm -rf build bin

-include $(shell find $(B)/obj $(B)/pic $(FZ)/obj -name '*.d' 2>/dev/null)
