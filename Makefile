# zps - synchronous data-parallel training on a sharded parameter server.
#
#   make            build bin/zps-server, bin/zps-worker, bin/zps-ctl
#   make demo       install missing Debian packages, build, train Fashion-MNIST on loopback
#   make test       install missing Debian packages, build, run unit and integration tests
#   make bench      ms/step of the default job with 1 and 2 workers (bench/train.sh)
#
# Dependencies come from pkg-config; deploy/install-deps.sh installs them.

OPT ?= -O3
PKGS := libzmq libprotobuf-c openblas zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

ZPS_CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Werror -MMD -MP \
	-I. -Ibuild $(PKG_CFLAGS) $(CFLAGS)
ZPS_LDLIBS := $(PKG_LIBS) -lm -pthread $(LDLIBS)

PROTO_C := build/proto/zps.pb-c.c
COMMON_SRC := $(PROTO_C) $(wildcard common/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
WORKER_SRC := $(filter-out worker/main.c,$(wildcard worker/*.c))
UNIT_SRC := tests/check_unit.c $(wildcard tests/common/*.c tests/server/*.c tests/worker/*.c)
INTEG_SRC := $(wildcard tests/integration/*.c)

obj = $(patsubst %.c,build/obj/%.o,$(patsubst build/%,%,$(1)))
COMMON_OBJ := $(call obj,$(COMMON_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
WORKER_OBJ := $(call obj,$(WORKER_SRC))

BINS := bin/zps-server bin/zps-worker bin/zps-ctl
TESTS := build/tests/check_unit build/tests/check_integration

.PHONY: all deps demo test test-unit test-integration bench clean
all: $(BINS)

deps:
	@bash deploy/install-deps.sh

$(PROTO_C): proto/zps.proto
	@mkdir -p build
	protoc-c --proto_path=. --c_out=build $<

# Every object may include the generated header.
build/obj/%.o: %.c | $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@
build/obj/proto/%.o: build/proto/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -c $< -o $@

build/libzps_common.a: $(COMMON_OBJ)
build/libzps_server.a: $(SERVER_OBJ)
build/libzps_worker.a: $(WORKER_OBJ)
build/%.a:
	@rm -f $@
	ar rcs $@ $^

bin/zps-server: build/obj/server/main.o build/libzps_server.a build/libzps_common.a
bin/zps-worker: build/obj/worker/main.o build/libzps_worker.a build/libzps_common.a
bin/zps-ctl: build/obj/ctl/zps_ctl.o build/libzps_common.a
bin/%:
	@mkdir -p bin
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(ZPS_LDLIBS)

CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
build/tests/check_unit: $(call obj,$(UNIT_SRC)) build/libzps_server.a build/libzps_worker.a \
		build/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(ZPS_LDLIBS)
build/tests/check_integration: $(call obj,$(INTEG_SRC)) build/libzps_common.a
	@mkdir -p $(dir $@)
	$(CC) $(ZPS_CFLAGS) -o $@ $^ $(CHECK_LIBS) $(ZPS_LDLIBS)

demo: deps
	@$(MAKE) --no-print-directory all
	@bash deploy/demo.sh

test: deps
	@$(MAKE) --no-print-directory all $(TESTS)
	@$(MAKE) --no-print-directory test-unit test-integration

test-unit: build/tests/check_unit
	build/tests/check_unit

test-integration: build/tests/check_integration $(BINS)
	build/tests/check_integration

bench: all
	@bash bench/train.sh

clean:
	rm -rf build bin

-include $(shell find build/obj -name '*.d' 2>/dev/null)
