# The two README commands: `make demo` and `make test`. Both build first and
# install missing Debian packages when run as root (or print the exact
# apt-get line otherwise).

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
DEB_PACKAGES = cmake make gcc pkg-config libjansson-dev libpcre2-dev liburing-dev libssl-dev
# The Python binding's tests also need Debian's torch and pytest (for /usr/bin/python3).
TEST_PACKAGES = $(DEB_PACKAGES) python3-torch python3-pytest python3-numpy

.PHONY: all deps test-deps install-packages configure build demo test clean format format-check

all: build

deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(DEB_PACKAGES)"

test-deps:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(TEST_PACKAGES)"

install-packages:
	@missing=""; for p in $(PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ]; then \
	        echo "installing:$$missing"; \
	        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) || exit 1; \
	    else \
	        echo "missing packages; run:"; echo "  sudo apt-get install -y$$missing"; exit 1; \
	    fi; \
	fi

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

# MAKEFLAGS and MAKELEVEL are cleared so the make that CMake runs does not print every
# directory it enters.
# The built library is also copied into the Python package, where `import ddo` finds it.
build: configure
	@MAKEFLAGS= MAKELEVEL= cmake --build $(BUILD) -j $(JOBS)
	@cp -f $(BUILD)/libddo.so python/ddo/libddo.so

demo: configure
	@MAKEFLAGS= MAKELEVEL= cmake --build $(BUILD) -j $(JOBS) --target ddo_tool
	./$(BUILD)/ddo demo

test: test-deps build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD)
