#!/bin/bash
# Crashes (no reward file) the first time it runs, then verifies hello.txt.
n=$(cat /state/crash-once 2>/dev/null || echo 0)
echo $((n + 1)) > /state/crash-once
[ "$n" = 0 ] && { echo "verifier broke: cannot import its test library" >&2; exit 3; }
[ "$(cat hello.txt 2>/dev/null)" = hello ] && r=1 || r=0
echo "$r" > /logs/verifier/reward.txt
