# The two README commands: `make demo` and `make test`. Both build first and
# install missing Debian packages when run as root (or print the exact
# apt-get line otherwise).

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
DEB_PACKAGES = cmake make gcc pkg-config libjansson-dev libpcre2-dev liburing-dev libssl-dev
# The wheel: a build with the dependencies linked statically, packed by /usr/bin/python3.
WHEEL_BUILD ?= build-wheel
DIST ?= dist
WHEEL_PACKAGES = $(DEB_PACKAGES) binutils python3
# The win_amd64 wheel: packed from a mingw-w64 cross build (docs/windows.md) into its own folder.
WIN_BUILD ?= build-win/b
WIN_DIST ?= dist-win
# The Python binding's tests also need Debian's torch and pytest (for /usr/bin/python3), and
# python3-venv: they run against the wheel installed in a fresh venv.
TEST_PACKAGES = $(WHEEL_PACKAGES) python3-torch python3-pytest python3-numpy python3-venv

.PHONY: all deps test-deps install-packages configure build demo wheel wheel-win test clean format \
	format-check

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
# directory it enters. Nothing is copied into the source tree: in a checkout, `import ddo`
# (PYTHONPATH=python) finds build/libddo.so by itself (python/ddo/_lib.py), or DDO_LIBRARY.
build: configure
	@MAKEFLAGS= MAKELEVEL= cmake --build $(BUILD) -j $(JOBS)

# The demo also builds the shared library (target libddo), which `import ddo`
# (PYTHONPATH=python /usr/bin/python3) finds next in build/.
demo: configure
	@MAKEFLAGS= MAKELEVEL= cmake --build $(BUILD) -j $(JOBS) --target ddo_tool libddo
	./$(BUILD)/ddo demo

# dist/ddo-<version>-py3-none-manylinux_2_<N>_x86_64.whl: libddo.so and the tool linked
# statically against their dependencies (python/build_backend/ddo_build.py checks and tags it).
wheel:
	@$(MAKE) --no-print-directory install-packages PACKAGES="$(WHEEL_PACKAGES)"
	@cmake -S . -B $(WHEEL_BUILD) -DDDO_STATIC_DEPS=ON $(CMAKE_FLAGS) >/dev/null
	@MAKEFLAGS= MAKELEVEL= cmake --build $(WHEEL_BUILD) -j $(JOBS) --target libddo ddo_tool
	@rm -f $(DIST)/ddo-*.whl
	@/usr/bin/python3 python/build_backend/ddo_build.py --build-dir $(WHEEL_BUILD) --out $(DIST)

# dist-win/ddo-<version>-py3-none-win_amd64.whl: libddo.dll and ddo.exe of the cross build in
# WIN_BUILD (brought up to date when it is configured); the backend refuses in one line when
# they are missing.
wheel-win:
	@if [ -f $(WIN_BUILD)/CMakeCache.txt ]; then \
	    MAKEFLAGS= MAKELEVEL= cmake --build $(WIN_BUILD) -j $(JOBS) --target libddo ddo_tool; fi
	@rm -f $(WIN_DIST)/ddo-*-win_amd64.whl
	@/usr/bin/python3 python/build_backend/ddo_build.py --platform win_amd64 \
	    --build-dir $(WIN_BUILD) --out $(WIN_DIST)

# The Python tests (CTest's python_binding) run against the wheel installed in a fresh venv.
test: test-deps build wheel
	DDOTEST_WHEEL="$$(ls $(abspath $(DIST))/ddo-*.whl)" ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(WHEEL_BUILD) $(DIST) $(WIN_DIST)
