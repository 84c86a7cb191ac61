# zps - synchronous data-parallel training on a sharded parameter server.
#
#   make            build bin/zps-server, bin/zps-worker, bin/zps-ctl
#   make demo       install missing Debian packages, build, train Fashion-MNIST on loopback
#   make test       install missing Debian packages, build, run unit and integration tests
#   make bench      ms/step of the default job with 1 and 2 workers (bench/train.sh)
#
# Checks (CI runs them after make test; their extra packages come from
# deploy/install-deps.sh --ci):
#   make test SAN=1 the same tests, everything built with ASan + UBSan into build/san/
#   make valgrind   one short training run (1 server, 2 workers) under valgrind memcheck
#   make lint       cppcheck and clang-tidy (.clang-tidy) over common/ server/ worker/ ctl/
#   make fuzz       libFuzzer over the message path for FUZZ_SECONDS (default 30)
#
# Dependencies come from pkg-config; deploy/install-deps.sh installs them.

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
PKGS := libzmq libprotobuf-c openblas zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

ZPS_CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -MMD -MP $(SAN_CFLAGS) \
	-I. -I$(B) $(PKG_CFLAGS) $(CFLAGS)
ZPS_LDLIBS := $(PKG_LIBS) -lm -pthread $(LDLIBS)

PROTO_C := $(B)/proto/zps.pb-c.c
COMMON_SRC := $(PROTO_C) $(wildcard common/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
WORKER_SRC := $(filter-out worker/main.c,$(wildcard worker/*.c))
UNIT_SRC := tests/check_unit.c $(wildcard tests/common/*.c tests/server/*.c tests/worker/*.c)
INTEG_SRC := $(wildcard tests/integration/*.c)

obj = $(patsubst %.c,$(B)/obj/%.o,$(patsubst $(B)/%,%,$(1)))
COMMON_OBJ := $(call obj,$(COMMON_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
WORKER_OBJ := $(call obj,$(WORKER_SRC))

BINS := $(BIN)/zps-server $(BIN)/zps-worker $(BIN)/zps-ctl
TESTS := $(B)/tests/check_unit $(B)/tests/check_integration

.PHONY: all deps demo test test-unit test-integration bench clean
all: $(BINS)

deps:
	@bash deploy/install-deps.sh

$(PROTO_C): proto/zps.proto
	@mkdir -p $(B)
	protoc-c --proto_path=. --c_out=$(B) $<

# Every object may include the generated header.
$(B)/obj/%.o: %.c | $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@
$(B)/obj/proto/%.o: $(B)/proto/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@

$(B)/libzps_common.a: $(COMMON_OBJ)
$(B)/libzps_server.a: $(SERVER_OBJ)
$(B)/libzps_worker.a: $(WORKER_OBJ)
$(B)/%.a:
	@rm -f $@
	ar rcs $@ $^

$(BIN)/zps-server: $(B)/obj/server/main.o $(B)/libzps_server.a $(B)/libzps_common.a
$(BIN)/zps-worker: $(B)/obj/worker/main.o $(B)/libzps_worker.a $(B)/libzps_common.a
$(BIN)/zps-ctl: $(B)/obj/ctl/zps_ctl.o $(B)/libzps_common.a
$(BIN)/%:
	@mkdir -p $(BIN)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(ZPS_LDLIBS)

CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
$(B)/tests/check_unit: $(call obj,$(UNIT_SRC)) $(B)/libzps_server.a $(B)/libzps_worker.a \
		$(B)/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(ZPS_LDLIBS)
$(B)/tests/check_integration: $(call obj,$(INTEG_SRC)) $(B)/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(ZPS_LDLIBS)

demo: deps
	@$(MAKE) --no-print-directory all
	@bash deploy/demo.sh

test: deps
	@$(MAKE) --no-print-directory all $(TESTS)
	@$(MAKE) --no-print-directory test-unit test-integration

test-unit: $(B)/tests/check_unit
	$(B)/tests/check_unit

# The integration tests start the binaries of this flavour (ZPS_BIN_DIR).
test-integration: $(B)/tests/check_integration $(BINS)
	ZPS_BIN_DIR=$(CURDIR)/$(BIN) $(B)/tests/check_integration

bench: all
	@bash bench/train.sh

clean:
	rm -rf build bin

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
