#!/bin/sh
# Runs Debian's protoc (protobuf-compiler); its version matches libprotobuf-dev.
exec /usr/bin/protoc "$@"
