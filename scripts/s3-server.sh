#!/usr/bin/env bash
# Provide a real S3 server for the tests and drills of models in object storage, in one directory printed on the
# last stdout line (progress goes to stderr):
#   versitygw  github.com/versity/versitygw's gateway (cmd/versitygw), an S3 API over a local directory (its
#              `posix` backend): buckets are folders, objects files, requests signed with AWS Signature V4.
#
# Cached in ${INFEROP_CACHE:-$HOME/.cache/inferop}/s3, once; a filled cache answers in milliseconds. Built from a
# throw-away wrapper module at a pinned version (go-cache.sh's build_from_module); the module and build caches are
# private to the build directory (so the download can be measured) and removed afterwards.
# Measured with Go 1.26.8 on 2 cores: 200 s alone, 268 s beside a test suite; 116 MiB of modules downloaded
# (362 MiB unpacked, 428 MiB of build cache on the way), a 43 MiB binary left in the cache.
#
# --no-build: never build; exit 3 when nothing is ready (for test suites that skip instead).
set -euo pipefail

VERSITYGW_VERSION=v1.8.0
NEEDED=(versitygw)
SCRIPT=s3-server
CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}/s3"
WHAT="versitygw $VERSITYGW_VERSION"
BUILD_TIME="3.5 to 4.5 minutes on 2 cores"
# shellcheck source=scripts/go-cache.sh
source "$(dirname "$0")/go-cache.sh"
go_cache_begin "$@"

# main.Version is what `versitygw --version` prints; its release build sets it the same way (its Makefile).
build_from_module versitygw github.com/versity/versitygw "$VERSITYGW_VERSION" \
    github.com/versity/versitygw/cmd/versitygw main.Version
go_cache_finish
