#!/usr/bin/env bash
# Regenerates the HdrHistogram reference percentiles with the Java implementation from
# Maven Central (needs java, javac and mvn). Prints them on stdout.
set -euo pipefail
version=2.2.2
mvn -q dependency:get -Dartifact=org.hdrhistogram:HdrHistogram:$version >&2
jar=~/.m2/repository/org/hdrhistogram/HdrHistogram/$version/HdrHistogram-$version.jar
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
javac -cp "$jar" -d "$tmp" "$(dirname "$0")/HdrVectors.java"
java -cp "$jar:$tmp" HdrVectors
