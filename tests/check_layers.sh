#!/usr/bin/env bash
# ctest-labels: unit
exit 0
