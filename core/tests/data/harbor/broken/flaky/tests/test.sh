#!/bin/bash
# Passes every third run whatever the agent did (a counter in /state stands for chance).
n=$(cat /state/flaky 2>/dev/null || echo 0)
echo $((n + 1)) > /state/flaky
[ $((n % 3)) = 0 ] && r=1 || r=0
echo "$r" > /logs/verifier/reward.txt
